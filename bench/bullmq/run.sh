#!/usr/bin/env bash
# BullMQ side of the mailstream benchmarks: fan-out (enqueue.js), the rate limiter
# (limiter.js) and Redis memory per job (memory.js), on the Redis given, which must be
# private to the benchmark: it is FLUSHALLed before each part.
#
#   bench/bullmq/run.sh redis://127.0.0.1:PORT [--quick]
#
# Full: enqueue 300000, limiter 300 jobs at 10/s, memory 100000 (about 2 minutes).
# Quick: enqueue 20000, limiter 60 jobs, memory 10000 (about 15 s).
# Progress goes to stderr; the last stdout line is one JSON object:
#   {"bullmq_version":...,"enqueue":{...},"limiter":{...},"memory":{...}}
set -euo pipefail

usage() { echo "usage: $0 redis://127.0.0.1:PORT [--quick]" >&2; exit 64; }
[ $# -ge 1 ] || usage
url=$1; shift
quick=0
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    *) usage ;;
  esac
done
case $url in redis://*) ;; *) usage ;; esac

dir=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$dir/node_modules/bullmq" ]; then
  echo "installing node_modules in $dir" >&2
  if [ -f "$dir/package-lock.json" ]; then
    npm ci --prefix "$dir" --no-audit --no-fund >&2
  else
    npm install --prefix "$dir" --no-audit --no-fund >&2
  fi
fi

if [ $quick = 1 ]; then
  enqueue_jobs=20000; limiter_jobs=60; memory_jobs=10000
else
  enqueue_jobs=300000; limiter_jobs=300; memory_jobs=100000
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

part() { # name, script, args...
  local name=$1 script=$2; shift 2
  node "$dir/lib.js" flushall "$url"
  echo "== $name" >&2
  local t0=$SECONDS
  node "$dir/$script" --redis "$url" "$@" > "$tmp/$name.out"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  echo "== $name done in $((SECONDS - t0)) s" >&2
}

start=$SECONDS
load_start=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "")
part enqueue enqueue.js --jobs "$enqueue_jobs" --batch 100
part limiter limiter.js --jobs "$limiter_jobs" --max 10 --duration 1000 --concurrency 50
part memory memory.js --jobs "$memory_jobs"
node "$dir/lib.js" flushall "$url"

node - "$dir" "$tmp" "$url" "$quick" "$((SECONDS - start))" "$load_start" <<'JS'
const [dir, tmp, url, quick, seconds, loadStart] = process.argv.slice(2);
const os = require('os');
const fs = require('fs');
const path = require('path');
const L = require(path.join(dir, 'lib.js'));
const part = name => JSON.parse(fs.readFileSync(path.join(tmp, `${name}.json`), 'utf8'));
(async () => {
  const r = L.admin(url);
  const redisVersion = await L.redisVersion(r);
  await r.quit();
  L.emit({
    bullmq_version: require(path.join(dir, 'node_modules/bullmq/package.json')).version,
    ioredis_version: require(path.join(dir, 'node_modules/ioredis/package.json')).version,
    node_version: process.version,
    redis_version: redisVersion,
    quick: quick === '1',
    total_seconds: Number(seconds),
    // 1/5/15-minute load averages at the start and the end: anything else running on
    // the 2 cores shows up here (and in the throughput figures).
    load_average_start: loadStart ? loadStart.split(' ').map(Number) : null,
    load_average_end: os.loadavg().map(x => Math.round(x * 100) / 100),
    enqueue: part('enqueue'),
    limiter: part('limiter'),
    memory: part('memory'),
  });
})().catch(err => { console.error(err); process.exit(1); });
JS
