#!/bin/bash
# usage: sqbench.sh BIN COMPRESSION -> transactions/s of 2000 single-row inserts (sqlite, WAL, synchronous=FULL)
BIN=$1; C=$2; cd /var/tmp/prof; rm -rf ol/*; $BIN mount -o compression=$C ol om 2>/dev/null
python3 - <<'PY'
import sqlite3,time,os
c=sqlite3.connect('om/t.db'); c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=FULL')
c.execute('CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT)')
rows=[f"read-{i} ACGTTGCAAGCTTGACCGATAGCTAGCTTTAGGC{i%977} quality IIIIIIIIIHHHHHGGGG" for i in range(2000)]
t=time.time()
for r in rows: c.execute('INSERT INTO t(a) VALUES(?)',(r,)); c.commit()
dt=time.time()-t
print(f"{2000/dt:.0f} tx/s", end=' ')
c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()
PY
$BIN umount om; echo "db stored $(du -k ol/t.db | cut -f1)K"
