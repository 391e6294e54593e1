#!/usr/bin/env python3
# Writes contrib/grafana/densefs.json, the Grafana dashboard of the metrics densefs exports
# (tests/metrics.rs checks every metric it queries against a scrape). Run from the repository root.
import json
panels=[]
def ts(title, exprs, unit, x, y, w=12, h=8):
    pid=len(panels)+1
    panels.append({
        "id": pid, "type": "timeseries", "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(65+i), "expr": e, "legendFormat": l, "datasource": {"type": "prometheus", "uid": "${datasource}"}} for i,(e,l) in enumerate(exprs)],
    })
sel='{instance=~"$instance"}'
comp_dev='{instance=~"$instance",op="compress",backend!="cpu"}'
comp='{instance=~"$instance",op="compress"}'
ts("Written (logical) by codec", [('sum by (codec) (rate(densefs_written_bytes_total'+sel+'[1m]))', "{{codec}}")], "Bps", 0, 0)
ts("Stored by codec", [('sum by (codec) (rate(densefs_stored_bytes_total'+sel+'[1m]))', "{{codec}}")], "Bps", 12, 0)
ts("Compression ratio of what was written", [('sum(rate(densefs_written_bytes_total'+sel+'[5m])) / sum(rate(densefs_stored_bytes_total'+sel+'[5m]))', "ratio")], "none", 0, 8)
ts("Read (decoded) by codec", [('sum by (codec) (rate(densefs_read_bytes_total'+sel+'[1m]))', "{{codec}}")], "Bps", 12, 8)
ts("Share of records an accelerator compressed", [('sum(rate(densefs_records_total'+comp_dev+'[5m])) / sum(rate(densefs_records_total'+comp+'[5m]))', "offload share")], "percentunit", 0, 16)
ts("Fallbacks to the CPU by reason", [('sum by (reason) (rate(densefs_offload_fallbacks_total'+sel+'[5m]))', "{{reason}}")], "ops", 12, 16)
ts("Records not stored compressed", [('sum by (outcome) (rate(densefs_record_outcomes_total'+sel+'[5m]))', "{{outcome}}")], "ops", 0, 24)
ts("Backends", [('densefs_backend_up'+sel, "{{backend}} up"), ('rate(densefs_backend_errors_total'+sel+'[5m])', "{{backend}} errors/s"), ('rate(densefs_backend_busy_seconds_total'+sel+'[1m])', "{{backend}} busy")], "short", 12, 24)
ts("FUSE requests by operation", [('sum by (op) (rate(densefs_fuse_requests_total'+sel+'[1m]))', "{{op}}")], "reqps", 0, 32)
ts("FUSE answer time by operation", [('histogram_quantile(0.99, sum by (op, le) (rate(densefs_fuse_request_duration_seconds_bucket'+sel+'[5m])))', "{{op}} p99"), ('sum by (op) (rate(densefs_fuse_request_duration_seconds_sum'+sel+'[5m])) / sum by (op) (rate(densefs_fuse_request_duration_seconds_count'+sel+'[5m]))', "{{op}} mean")], "s", 12, 32)
ts("Memory", [('densefs_memory_used_bytes'+sel, "used"), ('densefs_memory_limit_bytes'+sel, "limit (cache_size)")], "bytes", 0, 40)
ts("Daemon", [('rate(densefs_process_cpu_seconds_total'+sel+'[1m])', "CPU (cores)"), ('densefs_engine_queued_tasks'+sel, "engine queue"), ('densefs_descriptors'+sel, "lower descriptors"), ('densefs_inodes'+sel, "inodes known")], "short", 12, 40)
ts("compression=auto's choices", [('sum by (codec) (rate(densefs_auto_choices_total'+sel+'[5m]))', "{{codec}}")], "ops", 0, 48)
ts("Space: used and logical (densefs get)", [('densefs_used_bytes'+sel, "used {{instance}}"), ('densefs_logical_used_bytes'+sel, "logicalused {{instance}}")], "bytes", 12, 48)
ts("Compression ratio of what is stored (compressratio)", [('densefs_logical_used_bytes'+sel+' / densefs_used_bytes'+sel, "{{instance}}")], "none", 0, 56)
ts("Files and records stored, by kind", [('sum by (kind) (densefs_stored_records'+sel+')', "records {{kind}}"), ('densefs_files'+sel, "files {{instance}}")], "short", 12, 56)
ts("Space used by dataset (those with counters)", [('densefs_dataset_used_bytes'+sel, "used {{dataset}}"), ('densefs_dataset_logical_used_bytes'+sel, "logicalused {{dataset}}")], "bytes", 0, 64)
ts("Compression ratio by dataset", [('densefs_dataset_logical_used_bytes'+sel+' / densefs_dataset_used_bytes'+sel, "{{dataset}}")], "none", 12, 64)
dash={
 "title": "densefs",
 "uid": "densefs",
 "description": "A densefs mount's metrics (-o metrics=ADDR:PORT, or densefs metrics MOUNT through node exporter's textfile collector).",
 "schemaVersion": 39, "version": 1, "editable": True,
 "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
 "tags": ["densefs", "storage"],
 "templating": {"list": [
   {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
   {"name": "instance", "type": "query", "label": "Mount", "datasource": {"type": "prometheus", "uid": "${datasource}"},
    "query": {"query": "label_values(densefs_memory_limit_bytes, instance)", "refId": "instance"},
    "definition": "label_values(densefs_memory_limit_bytes, instance)",
    "includeAll": True, "multi": True, "refresh": 2, "current": {"text": "All", "value": "$__all"}},
 ]},
 "panels": panels,
}
open("contrib/grafana/densefs.json","w").write(json.dumps(dash, indent=2)+"\n")
