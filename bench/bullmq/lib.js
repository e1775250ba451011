'use strict';
// Shared helpers for the BullMQ benchmarks: argument parsing, the Redis connection,
// INFO figures, the job descriptors (natural dedup key as jobId) and the JSON output.
//
// Also usable from the shell: `node lib.js flushall redis://127.0.0.1:PORT`
// (run.sh uses it so that it needs no redis-cli).

const IORedis = require('ioredis');

const QUEUE = 'mailstream-bench';

// --name value / --flag  ->  { name: value, flag: true }
function parseArgs(argv, defaults) {
  const out = Object.assign({}, defaults);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument: ${a}`);
    const key = a.slice(2);
    const next = argv[i + 1];
    if (next === undefined || next.startsWith('--')) {
      out[key] = true;
    } else {
      out[key] = next;
      i++;
    }
  }
  if (typeof out.redis !== 'string') throw new Error('--redis redis://127.0.0.1:PORT is required');
  return out;
}

function int(v, name) {
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`--${name} must be a positive integer (got ${v})`);
  return n;
}

// ioredis options from a redis:// URL; BullMQ builds its own connections from these.
// maxRetriesPerRequest: null is what BullMQ requires of a Worker's connection.
function connectionFromUrl(url) {
  const u = new URL(url);
  if (u.protocol !== 'redis:') throw new Error(`only redis:// URLs are supported (got ${url})`);
  const opts = {
    host: u.hostname || '127.0.0.1',
    port: Number(u.port || 6379),
    maxRetriesPerRequest: null,
    enableOfflineQueue: true,
  };
  if (u.password) opts.password = decodeURIComponent(u.password);
  if (u.username) opts.username = decodeURIComponent(u.username);
  const db = u.pathname.replace(/^\//, '');
  if (db) opts.db = Number(db);
  return opts;
}

// The scripts' own connection (INFO, FLUSHALL, counts). Unlike BullMQ's, it gives up
// after ~2 s of failed connection attempts, so that a wrong URL fails fast: each
// script PINGs through it first.
function admin(url) {
  return new IORedis(Object.assign(connectionFromUrl(url), {
    maxRetriesPerRequest: 1,
    retryStrategy: times => (times > 10 ? null : 200),
  }));
}

function parseInfo(text) {
  const out = {};
  for (const line of text.split('\r\n')) {
    const i = line.indexOf(':');
    if (i > 0 && !line.startsWith('#')) out[line.slice(0, i)] = line.slice(i + 1);
  }
  return out;
}

async function usedMemory(r) {
  return Number(parseInfo(await r.info('memory')).used_memory);
}

async function redisCpuSeconds(r) {
  const cpu = parseInfo(await r.info('cpu'));
  return Number(cpu.used_cpu_sys) + Number(cpu.used_cpu_user);
}

// Busy CPU seconds of the whole machine (all cores) from /proc/stat; null off Linux.
function machineBusySeconds() {
  try {
    const line = require('fs').readFileSync('/proc/stat', 'utf8').split('\n')[0];
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    const idle = f[3] + (f[4] || 0);
    const total = f.slice(0, 8).reduce((a, b) => a + b, 0);
    return (total - idle) / 100; // USER_HZ is 100 on Linux
  } catch (_) {
    return null;
  }
}

// CPU seconds used by this process (user + system).
function ownCpuSeconds() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

async function redisVersion(r) {
  return parseInfo(await r.info('server')).redis_version;
}

async function flushall(r) {
  await r.flushall('SYNC');
}

// Lua scripts are kept across FLUSHALL; load BullMQ's (the ones it uses to add, fetch
// and finish jobs) before a "before" memory reading so that the script cache is not
// counted as per-job memory. Runs one job through a throwaway queue, then flushes.
async function warmScripts(url, bullmq) {
  const { Queue, Worker } = bullmq;
  const connection = connectionFromUrl(url);
  const q = new Queue('warmup', { connection });
  await q.addBulk([{ name: 'w', data: {}, opts: { jobId: 'w|1' } }]);
  await new Promise((resolve, reject) => {
    const w = new Worker('warmup', async () => 1, { connection, autorun: true });
    w.on('completed', () => w.close().then(resolve, reject));
    w.on('error', reject);
  });
  await q.close();
  const r = admin(url);
  await flushall(r);
  await r.quit();
}

// The natural dedup key of a delivery. mailstream names a delivery
// `campaign:period:subscriber:target`; BullMQ 5 rejects a custom jobId that contains
// ':' (unless it has exactly 3 parts: "Custom Id cannot contain :"), so the same four
// parts are joined with '|' (same length, same uniqueness).
const CAMPAIGN = 'weekly_digest';
const PERIOD = '2026-W49';

function subscriber(i) {
  return `user-${String(i).padStart(6, '0')}`;
}

function target(i) {
  return `team-${i % 1000}`;
}

function jobId(i) {
  return `${CAMPAIGN}|${PERIOD}|${subscriber(i)}|${target(i)}`;
}

// One addBulk entry. `opts` is merged into the job options (e.g. removeOnComplete).
function jobDescriptor(i, opts) {
  return {
    name: CAMPAIGN,
    data: { campaign: CAMPAIGN, period: PERIOD, subscriber: subscriber(i), target: target(i) },
    opts: Object.assign({ jobId: jobId(i) }, opts || {}),
  };
}

function chunkDescriptors(start, end, opts) {
  const out = new Array(end - start);
  for (let i = start; i < end; i++) out[i - start] = jobDescriptor(i, opts);
  return out;
}

// Adds jobs [0, n) with addBulk in chunks of `batch`, `inFlight` chunks at a time.
// Returns the seconds it took (wall clock, from the first call to the last answer).
async function addAll(queue, n, batch, inFlight, opts, progress) {
  let next = 0;
  let done = 0;
  const t0 = process.hrtime.bigint();
  let lastReport = Date.now();
  async function lane() {
    for (;;) {
      const start = next;
      if (start >= n) return;
      next = Math.min(n, start + batch);
      const end = next;
      await queue.addBulk(chunkDescriptors(start, end, opts));
      done += end - start;
      if (progress && Date.now() - lastReport >= 2000) {
        lastReport = Date.now();
        log(`  ${progress}: ${done}/${n} added`);
      }
    }
  }
  const lanes = [];
  for (let k = 0; k < inFlight; k++) lanes.push(lane());
  await Promise.all(lanes);
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

// Waits until the wait/active/completed counts satisfy `pred`, polling.
async function waitFor(pred, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await pred()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

function nowMs() {
  return Number(process.hrtime.bigint()) / 1e6;
}

function log(msg) {
  process.stderr.write(msg + '\n');
}

function round(x, digits) {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

// The most timestamps (ms) in any half-open window [t, t + windowMs), t ranging over
// the timestamps themselves (the maximum is always reached at one of them).
function worstWindow(timestampsMs, windowMs) {
  const ts = timestampsMs.slice().sort((a, b) => a - b);
  let best = 0;
  let bestAt = 0;
  let j = 0;
  for (let i = 0; i < ts.length; i++) {
    if (j < i) j = i;
    while (j < ts.length && ts[j] < ts[i] + windowMs) j++;
    if (j - i > best) {
      best = j - i;
      bestAt = ts[i];
    }
  }
  return { count: best, at: bestAt, sorted: ts };
}

// Prints the result as the last stdout line and exits.
function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

// Runs `main`, with a hard deadline so that a stuck run still stops by itself.
function run(main, hardTimeoutMs) {
  const timer = setTimeout(() => {
    log(`error: gave up after ${Math.round(hardTimeoutMs / 1000)} s`);
    process.exit(2);
  }, hardTimeoutMs);
  timer.unref();
  main().then(
    () => process.exit(0),
    err => {
      log(`error: ${err && err.stack ? err.stack : err}`);
      process.exit(1);
    },
  );
}

module.exports = {
  QUEUE,
  parseArgs,
  int,
  connectionFromUrl,
  admin,
  parseInfo,
  usedMemory,
  redisCpuSeconds,
  redisVersion,
  machineBusySeconds,
  ownCpuSeconds,
  flushall,
  warmScripts,
  jobId,
  jobDescriptor,
  chunkDescriptors,
  addAll,
  waitFor,
  sleep,
  nowMs,
  log,
  round,
  worstWindow,
  emit,
  run,
};

if (require.main === module) {
  const [cmd, url] = process.argv.slice(2);
  if (cmd !== 'flushall' || !url) {
    log('usage: node lib.js flushall redis://127.0.0.1:PORT');
    process.exit(64);
  }
  const r = admin(url);
  r.ping()
    .then(() => flushall(r))
    .then(() => r.quit())
    .then(
      () => process.exit(0),
      err => {
        log(`error: ${err}`);
        process.exit(1);
      },
    );
}
