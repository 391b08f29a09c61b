"""Peak bytes of SQLite temp files a sandbox worker holds during one query (Linux: /proc).

    python bench/bench_sql_temp_storage.py ../shared/data/spider/database/sakila_1/sakila_1.sqlite \
        "SELECT a.rental_id, b.payment_id, a.last_update || b.last_update AS s FROM rental a, payment b ORDER BY s"

Before ``max_temp_bytes`` (temp files on disk): timeout after 5 s holding 216 MB of them (446 MB
on the reporter's machine); after: ``too_large`` in 3.7 s, 0 MB on disk.
"""

import os
import sys
import threading
import time

from agentgym_lightning.envs.spider.sandbox import SQLSandbox

db, sql = sys.argv[1], sys.argv[2]
sb = SQLSandbox()
peak = [0]; stop = threading.Event()
def watch():
    while not stop.is_set():
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if b"sql_worker.py" not in cmd or os.getppid() == pid:
                continue
            total = 0
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if "(deleted)" in target or "etilqs" in target:
                            total += os.stat(f"/proc/{pid}/fd/{fd}").st_size
                    except OSError:
                        pass
            except OSError:
                continue
            peak[0] = max(peak[0], total)
        time.sleep(0.02)
t = threading.Thread(target=watch); t.start()
start = time.time()
r = sb.run(db, sql)
stop.set(); t.join()
print(f"{r.error or 'ok'} ({(r.message or '')[:80]}) in {time.time()-start:.1f}s; peak temp files {peak[0]/1e6:.0f} MB")
sb.close()
