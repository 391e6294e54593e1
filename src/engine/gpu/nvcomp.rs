//! nvCOMP 6's batched low-level C API, loaded at run time (libloading), bound against the 6.0
//! headers (`include/nvcomp/{lz4,deflate,zstd}.h` of the `nvidia-libnvcomp-cu13` wheel). The
//! three formats share one set of signatures and differ only in their 64-byte option structs,
//! which are passed by value; so one [`Format`] row of function pointers per format.

use libloading::Library;
use std::ffi::c_void;
use std::path::{Path, PathBuf};

pub type Status = i32;
pub const SUCCESS: Status = 0;
/// `cudaStream_t` (the same object as the driver API's `CUstream`).
pub type Stream = *mut c_void;

/// Every option struct of the 6.0 API is 64 bytes (reserved bytes zero), 4-byte aligned.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Opts {
    pub words: [i32; 16],
}

impl Opts {
    pub const ZERO: Opts = Opts { words: [0; 16] };

    /// `nvcompBatchedDeflateCompressOpts_t { int algorithm; char reserved[60]; }`
    pub fn deflate(algorithm: i32) -> Opts {
        let mut o = Opts::ZERO;
        o.words[0] = algorithm;
        o
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Alignments {
    pub input: usize,
    pub output: usize,
    pub temp: usize,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct Properties {
    version: u32,
    cudart_version: u32,
}

type GetAlignments = unsafe extern "C" fn(Opts, *mut Alignments) -> Status;
type GetTempSize = unsafe extern "C" fn(usize, usize, Opts, *mut usize, usize, Stream) -> Status;
type GetMaxOutputChunkSize = unsafe extern "C" fn(usize, Opts, *mut usize) -> Status;
type CompressAsync = unsafe extern "C" fn(
    *const *const c_void, // device_uncompressed_chunk_ptrs
    *const usize,         // device_uncompressed_chunk_bytes
    usize,                // max_uncompressed_chunk_bytes
    usize,                // num_chunks
    *mut c_void,          // device_temp_ptr
    usize,                // temp_bytes
    *const *mut c_void,   // device_compressed_chunk_ptrs
    *mut usize,           // device_compressed_chunk_bytes
    Opts,
    *mut Status, // device_statuses
    Stream,
) -> Status;
type DecompressAsync = unsafe extern "C" fn(
    *const *const c_void, // device_compressed_chunk_ptrs
    *const usize,         // device_compressed_chunk_bytes
    *const usize,         // device_uncompressed_buffer_bytes
    *mut usize,           // device_uncompressed_chunk_bytes (actual)
    usize,                // num_chunks
    *mut c_void,          // device_temp_ptr
    usize,                // temp_bytes
    *const *mut c_void,   // device_uncompressed_chunk_ptrs
    Opts,
    *mut Status, // device_statuses
    Stream,
) -> Status;

/// One format's functions (`nvcompBatched<Name>...`).
pub struct Format {
    pub name: &'static str,
    pub compress_alignments: GetAlignments,
    pub compress_temp_size: GetTempSize,
    pub max_output_chunk_size: GetMaxOutputChunkSize,
    pub compress: CompressAsync,
    pub decompress_alignments: GetAlignments,
    pub decompress_temp_size: GetTempSize,
    pub decompress: DecompressAsync,
}

pub struct Nvcomp {
    pub lz4: Format,
    pub deflate: Format,
    pub zstd: Format,
    /// e.g. 6000 for 6.0.0.
    pub version: u32,
    pub cudart_version: u32,
    pub path: PathBuf,
    // Last: the function pointers above point into it.
    _lib: Library,
}

/// A function pointer from `lib`; `T` must be the symbol's C signature (the types above,
/// bound against the 6.0 headers), and stays valid while `lib` is loaded (`Nvcomp` keeps it).
fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    // SAFETY: every caller names an nvCOMP 6 function with its header's signature as `T`; the
    // copied pointer is used only while `Nvcomp` holds the library.
    unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| format!("{name}: {e}")) }
}

fn format(lib: &Library, name: &'static str) -> Result<Format, String> {
    let f = |suffix: &str| format!("nvcompBatched{name}{suffix}");
    Ok(Format {
        name,
        compress_alignments: symbol(lib, &f("CompressGetRequiredAlignments"))?,
        compress_temp_size: symbol(lib, &f("CompressGetTempSize"))?,
        max_output_chunk_size: symbol(lib, &f("CompressGetMaxOutputChunkSize"))?,
        compress: symbol(lib, &f("CompressAsync"))?,
        decompress_alignments: symbol(lib, &f("DecompressGetRequiredAlignments"))?,
        decompress_temp_size: symbol(lib, &f("DecompressGetTempSize"))?,
        decompress: symbol(lib, &f("DecompressAsync"))?,
    })
}

/// Where libnvcomp.so.6 may be: `DENSEFS_NVCOMP` (the file or its folder), the loader's own
/// search (LD_LIBRARY_PATH, ldconfig), beside the executable, and pip's `nvidia/libnvcomp/lib64`
/// in the usual site-packages folders.
pub fn candidates() -> Vec<PathBuf> {
    const FILE: &str = "libnvcomp.so.6";
    let mut out = Vec::new();
    if let Ok(p) = std::env::var("DENSEFS_NVCOMP") {
        let p = PathBuf::from(p);
        out.push(if p.is_dir() { p.join(FILE) } else { p });
    }
    out.push(PathBuf::from(FILE));
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        out.push(dir.join(FILE));
        out.push(dir.join("../lib/densefs").join(FILE));
    }
    let mut roots: Vec<PathBuf> = vec!["/usr/lib/python3/dist-packages".into(), "/usr/local/lib/densefs".into()];
    for base in ["/usr/local/lib", "/usr/lib", "/opt/torch/.venv/lib"] {
        if let Ok(entries) = std::fs::read_dir(base) {
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    roots.push(e.path().join("dist-packages"));
                    roots.push(e.path().join("site-packages"));
                }
            }
        }
    }
    for root in roots {
        out.push(root.join("nvidia/libnvcomp/lib64").join(FILE));
    }
    out
}

impl Nvcomp {
    /// Loads the first library found (see [`candidates`]).
    pub fn load() -> Result<Nvcomp, String> {
        let mut tried = Vec::new();
        for path in candidates() {
            if path.components().count() > 1 && !path.exists() {
                continue;
            }
            // SAFETY: loading runs the library's initializers, which nvCOMP (made to be loaded
            // at run time, as its Python wheels do) allows at any point; nothing is called
            // before `bind` checks the version.
            match unsafe { Library::new(&path) } {
                Ok(lib) => return Nvcomp::bind(lib, path),
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(format!(
            "libnvcomp.so.6 not found (pip download nvidia-libnvcomp-cu13 and set DENSEFS_NVCOMP to its lib64 folder); tried {}",
            tried.join("; ")
        ))
    }

    fn bind(lib: Library, path: PathBuf) -> Result<Nvcomp, String> {
        let get_properties: unsafe extern "C" fn(*mut Properties) -> Status = symbol(&lib, "nvcompGetProperties")?;
        let mut props = Properties::default();
        // SAFETY: nvcompGetProperties writes one Properties struct (repr(C), as in the header).
        let status = unsafe { get_properties(&mut props) };
        if status != SUCCESS {
            return Err(format!("nvcompGetProperties failed: {}", status_name(status)));
        }
        if props.version / 1000 != 6 {
            return Err(format!("{} is nvCOMP {}, densefs needs 6.x", path.display(), props.version));
        }
        Ok(Nvcomp {
            lz4: format(&lib, "LZ4")?,
            deflate: format(&lib, "Deflate")?,
            zstd: format(&lib, "Zstd")?,
            version: props.version,
            cudart_version: props.cudart_version,
            path,
            _lib: lib,
        })
    }
}

pub fn status_name(s: Status) -> String {
    let name = match s {
        0 => "success",
        10 => "invalid value",
        11 => "not supported",
        12 => "cannot decompress",
        13 => "bad checksum",
        14 => "cannot verify checksums",
        15 => "output buffer too small",
        16 => "wrong header length",
        17 => "alignment",
        18 => "chunk size too large",
        19 => "cannot compress",
        20 => "wrong input length",
        21 => "batch size too large",
        1000 => "CUDA error",
        10000 => "internal error",
        _ => "unknown status",
    };
    format!("nvCOMP {name} ({s})")
}

/// Host-only calls, so they run on any machine that has the library (no GPU needed): they prove
/// the binding (symbol names, by-value option structs) against the real 6.0 library.
#[cfg(test)]
mod tests {
    use super::*;

    fn library() -> Option<Nvcomp> {
        match Nvcomp::load() {
            Ok(n) => Some(n),
            Err(e) if std::env::var_os("DENSEFS_REQUIRE_NVCOMP").is_some() => panic!("{e}"),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn the_binding_matches_the_6_0_library() {
        let Some(nv) = library() else { return };
        assert_eq!(nv.version / 1000, 6);
        let max = |f: &Format, opts: Opts, len: usize| {
            let mut n = 0usize;
            // SAFETY: nvCOMP writes one usize into `n`.
            assert_eq!(unsafe { (f.max_output_chunk_size)(len, opts, &mut n) }, SUCCESS, "{}", f.name);
            n
        };
        // Worst-case output bounds: a little over the input for LZ4 and Zstd; Deflate's is larger.
        let lz4 = max(&nv.lz4, Opts::ZERO, 131072);
        let zstd = max(&nv.zstd, Opts::ZERO, 131072);
        assert!((131072..131072 + 4096).contains(&lz4), "{lz4}");
        assert!((131072..131072 + 4096).contains(&zstd), "{zstd}");
        for algorithm in 1..=5 {
            let deflate = max(&nv.deflate, Opts::deflate(algorithm), 131072);
            assert!((131072..131072 * 4).contains(&deflate), "{deflate}");
            let mut temp = 0usize;
            // SAFETY: a size query: nvCOMP writes one usize into `temp` (no stream: null).
            let s = unsafe {
                (nv.deflate.compress_temp_size)(64, 131072, Opts::deflate(algorithm), &mut temp, 64 * 131072, std::ptr::null_mut())
            };
            assert_eq!(s, SUCCESS);
            assert!(temp > 0);
        }
        for f in [&nv.lz4, &nv.deflate, &nv.zstd] {
            let mut a = Alignments::default();
            // SAFETY: nvCOMP writes one Alignments struct (repr(C), as in the header) into `a`.
            assert_eq!(unsafe { (f.compress_alignments)(Opts::ZERO, &mut a) }, SUCCESS);
            assert!(a.input.is_power_of_two() && a.output.is_power_of_two() && a.temp.is_power_of_two(), "{} {a:?}", f.name);
            assert!(a.input <= 256 && a.output <= 256 && a.temp <= 256, "{} {a:?}", f.name);
        }
    }
}
