//! `densefs completions SHELL`: clap's completions of commands and flags, and for bash also the
//! words clap cannot know, made from the same tables as help and the manual pages: property
//! names after `get`, `set` (`name=`) and `inherit`, mount options after `mount -o`, codecs,
//! checksums and offload targets after `compression=`, `checksum=` and `offload=`, comma lists
//! completed item by item.

use super::mount_options::MOUNT_OPTIONS;
use super::props::READ_ONLY;
use crate::core::props::SETTABLE;
use clap_complete::Shell;
use std::io::Write;

pub fn write(shell: Shell, command: &mut clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    clap_complete::generate(shell, command, "densefs", out);
    if shell == Shell::Bash {
        out.write_all(bash_values().as_bytes())?;
    }
    Ok(())
}

/// Every value of `compression=`: each codec's names, and each of its levels.
fn codec_words() -> Vec<String> {
    let mut words = vec!["auto".to_string()];
    for row in &crate::codec::CODECS {
        words.extend(row.aliases.iter().map(|a| a.to_string()));
        words.push(row.name.to_string());
        if let Some(l) = row.levels {
            words.extend((l.min.max(1)..=l.max).map(|n| format!("{}-{n}", row.name)));
            words.extend((1..=l.fast).map(|n| format!("{}-fast-{n}", row.name)));
        }
    }
    words.dedup();
    words
}

fn mount_option_words() -> Vec<String> {
    let mut words: Vec<String> = SETTABLE.iter().map(|p| format!("{p}=")).collect();
    for option in &MOUNT_OPTIONS {
        let eq = if option.value.is_empty() { "" } else { "=" };
        words.extend(option.names.iter().map(|n| format!("{n}{eq}")));
    }
    words
}

/// A bash function run before clap's `_densefs`: it answers where a property, a mount option
/// or a value is expected, and hands everything else to `_densefs`.
fn bash_values() -> String {
    // Read-only names with a placeholder (records_ALG) are not words to complete.
    let read_only = READ_ONLY.iter().map(|(n, _)| *n).filter(|n| !n.chars().any(|c| c.is_ascii_uppercase()));
    let readable: Vec<&str> = ["all"].into_iter().chain(SETTABLE).chain(read_only).collect();
    let settable_eq: Vec<String> = SETTABLE.iter().map(|p| format!("{p}=")).collect();
    let checksums: Vec<&str> = crate::checksum::ChecksumKind::ALL.iter().map(|k| k.name()).collect();
    let offload: Vec<&str> =
        ["auto", "cpu"].into_iter().chain(crate::engine::DEVICES.iter().filter(|d| !d.test_only).map(|d| d.name)).collect();
    let recordsizes: Vec<String> =
        (12..=20).map(|s| if s >= 20 { format!("{}M", 1 << (s - 20)) } else { format!("{}K", 1 << (s - 10)) }).collect();
    format!(
        r#"
# Property names, mount options and their values (densefs's tables).
_densefs_values() {{
    # Words as the shell split them, on blanks only (bash also breaks at "=", which these
    # words contain).
    local line="${{COMP_LINE:0:COMP_POINT}}"
    local cur="${{line##*[[:blank:]]}}"
    local -a words
    read -ra words <<< "${{line%"$cur"}}"
    local prev="${{words[${{#words[@]}}-1]}}"
    local sub="" positional=0 i w list=""
    for ((i = 1; i < ${{#words[@]}}; i++)); do
        w="${{words[i]}}"
        if [[ -z "$sub" ]]; then
            [[ "$w" != -* ]] && sub="$w"
            continue
        fi
        [[ "$w" == -* || "${{words[i-1]}}" == -o ]] && continue
        positional=$((positional + 1))
    done
    local head="" last="$cur"
    if [[ "$cur" == *,* ]]; then head="${{cur%,*}},"; last="${{cur##*,}}"; fi
    if [[ "$last" == *=* && ( "$prev" == -o || ( $positional -eq 0 && "$sub" == set ) ) ]]; then
        head="$head${{last%%=*}}="
        case "${{last%%=*}}" in
            compression|compress) list="{codecs}" ;;
            checksum) list="{checksums}" ;;
            offload) list="{offload}" ;;
            recordsize) list="{recordsizes}" ;;
            io_uring) list="auto on off" ;;
            precheck|verify) list="on off" ;;
        esac
        last="${{last#*=}}"
    elif [[ "$prev" == -o ]]; then
        case "$sub" in
            mount) list="{mount_options}" ;;
            recompress) list="compression= recordsize=" ;;
            get|list) list="name property value source" ;;
        esac
    elif [[ $positional -eq 0 && "$cur" != -* ]]; then
        case "$sub" in
            get) list="{readable}" ;;
            set) list="{settable_eq}" ;;
            inherit) list="{settable}" ;;
        esac
    fi
    if [[ -n "$list" ]]; then
        COMPREPLY=($(compgen -P "$head" -W "$list" -- "$last"))
        [[ ${{#COMPREPLY[@]}} -eq 1 && "${{COMPREPLY[0]}}" == *= ]] && compopt -o nospace
        # Bash replaces only what follows the word's last "=" (one of its word breaks).
        if [[ "$COMP_WORDBREAKS" == *=* && "$cur" == *=* ]]; then
            COMPREPLY=("${{COMPREPLY[@]#"${{cur%=*}}="}}")
        fi
        return 0
    fi
    _densefs "$@"
}}
complete -F _densefs_values -o bashdefault -o default densefs
"#,
        codecs = codec_words().join(" "),
        checksums = checksums.join(" "),
        offload = offload.join(" "),
        recordsizes = recordsizes.join(" "),
        mount_options = mount_option_words().join(" "),
        readable = readable.join(" "),
        settable_eq = settable_eq.join(" "),
        settable = SETTABLE.join(" "),
    )
}
