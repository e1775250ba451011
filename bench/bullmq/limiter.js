#!/usr/bin/env node
'use strict';
// BullMQ's rate limiter, measured where it matters: how many jobs start in the worst
// sliding window of `duration` ms.
//
// Main run: N jobs are added first (addBulk), then one Worker with
// limiter {max, duration} and concurrency 50 (not the bottleneck) processes them; the
// processor only records when it starts (process.hrtime, ms). worst_second is the most
// starts in any half-open window [t, t + duration), over the sorted starts (two
// pointers).
//
// Also reported: windows_over_max (how many of the windows [start_i, start_i + duration)
// held more than max), and the shortest time in which max + 1 and 2 x max jobs started
// (below `duration` means the limit was exceeded in a sliding window; the starts are
// taken in this process, so they carry its sub-millisecond scheduling jitter).
//
// Boundary probe (skip with --no-probe): the arrival pattern that a fixed window lets
// through twice. One job opens a window; just before the window ends
// (--probe-at, default 0.95 of duration, after the first start) 2 x max more jobs are
// added: the rest of the first window's quota starts at once, and the next window's
// quota at its opening, so both land within one sliding second.
//
//   node limiter.js --redis redis://127.0.0.1:PORT --jobs 300 [--max 10] [--duration 1000] [--concurrency 50]
//                   [--no-probe] [--probe-at 0.95] [--starts (also print every start, ms from the first)]
//
// This script FLUSHALLs the Redis it is given: use a private one.

const bullmq = require('bullmq');
const L = require('./lib');

// Runs a Worker with the limiter until `expect` jobs have completed; `feed` adds the
// jobs (it is called once the worker is running and gets the starts recorded so far).
async function measure({ url, queueName, max, duration, concurrency, expect, feed }) {
  const connection = L.connectionFromUrl(url);
  const queue = new bullmq.Queue(queueName, { connection });
  await queue.waitUntilReady();
  const starts = [];
  let completed = 0;
  let resolveDone;
  const done = new Promise(resolve => (resolveDone = resolve));
  const t0 = L.nowMs();
  await feed.before(queue);
  const worker = new bullmq.Worker(
    queueName,
    async () => {
      starts.push(L.nowMs());
    },
    { connection, concurrency, limiter: { max, duration } },
  );
  worker.on('completed', () => {
    completed++;
    if (completed % 50 === 0) L.log(`  ${queueName}: ${completed}/${expect} done, ${L.round((L.nowMs() - t0) / 1000, 1)} s`);
    if (completed === expect) resolveDone();
  });
  worker.on('error', err => L.log(`worker error: ${err}`));
  await worker.waitUntilReady();
  await feed.after(queue, starts);
  await done;
  const tEnd = L.nowMs();
  await worker.close();
  const counts = await queue.getJobCounts('completed', 'wait', 'active', 'failed', 'delayed');
  await queue.close();
  if (counts.completed !== expect || starts.length !== expect) {
    throw new Error(`expected ${expect} completed jobs, found ${JSON.stringify(counts)} (${starts.length} starts)`);
  }
  const w = L.worstWindow(starts, duration);
  // How many of the sliding windows (one per start) held more than max.
  let over = 0;
  let j = 0;
  const ts = w.sorted;
  for (let i = 0; i < ts.length; i++) {
    if (j < i) j = i;
    while (j < ts.length && ts[j] < ts[i] + duration) j++;
    if (j - i > max) over++;
  }
  const first = ts[0];
  // The shortest time in which k jobs started (min over i of ts[i + k - 1] - ts[i]).
  const shortestSpan = k => {
    let best = Infinity;
    for (let i = 0; i + k - 1 < ts.length; i++) best = Math.min(best, ts[i + k - 1] - ts[i]);
    return best === Infinity ? null : best;
  };
  return {
    seconds: (tEnd - t0) / 1000,
    spanMaxPlus1: shortestSpan(max + 1),
    span2Max: shortestSpan(2 * max),
    starts: ts,
    worst: w.count,
    worstAtMs: w.at - first,
    windowsOverMax: over,
    spanMs: ts[ts.length - 1] - first,
  };
}

async function main() {
  const args = L.parseArgs(process.argv.slice(2), {
    jobs: '300',
    max: '10',
    duration: '1000',
    concurrency: '50',
    'probe-at': '0.95',
  });
  const n = L.int(args.jobs, 'jobs');
  const max = L.int(args.max, 'max');
  const duration = L.int(args.duration, 'duration');
  const concurrency = L.int(args.concurrency, 'concurrency');
  const probeAt = Number(args['probe-at']);
  const r = L.admin(args.redis);
  await r.ping();

  L.log(`limiter: ${n} jobs, limiter {max: ${max}, duration: ${duration}}, concurrency ${concurrency}, ` +
    `expected ~${L.round((n / max) * duration / 1000, 1)} s`);
  await L.warmScripts(args.redis, bullmq);
  await L.flushall(r);

  const main = await measure({
    url: args.redis,
    queueName: L.QUEUE,
    max,
    duration,
    concurrency,
    expect: n,
    feed: {
      before: async queue => {
        for (let i = 0; i < n; i += 1000) await queue.addBulk(L.chunkDescriptors(i, Math.min(n, i + 1000)));
      },
      after: async () => {},
    },
  });
  L.log(`limiter: worst sliding ${duration} ms window: ${main.worst} starts (max ${max}); ${L.round(main.seconds, 2)} s`);

  const out = {
    jobs: n,
    max,
    duration_ms: duration,
    concurrency,
    worst_second: main.worst,
    worst_window_at_ms: L.round(main.worstAtMs, 1),
    windows_over_max: main.windowsOverMax,
    shortest_ms_for_max_plus_1_starts: main.spanMaxPlus1 === null ? null : L.round(main.spanMaxPlus1, 1),
    shortest_ms_for_2x_max_starts: main.span2Max === null ? null : L.round(main.span2Max, 1),
    seconds: L.round(main.seconds, 3),
    jobs_per_second: L.round(n / main.seconds, 3),
    first_to_last_start_seconds: L.round(main.spanMs / 1000, 3),
    starts_per_second_first_to_last: L.round((n - 1) / (main.spanMs / 1000), 3),
  };
  if (args.starts) out.starts_ms = main.starts.map(t => L.round(t - main.starts[0], 1));

  if (!args['no-probe']) {
    await L.flushall(r);
    const probeJobs = 1 + 2 * max;
    L.log(`limiter probe: 1 job, then ${2 * max} more at ${probeAt} x ${duration} ms after its start`);
    const probe = await measure({
      url: args.redis,
      queueName: `${L.QUEUE}-probe`,
      max,
      duration,
      concurrency,
      expect: probeJobs,
      feed: {
        before: async () => {},
        after: async (queue, starts) => {
          await queue.addBulk([L.jobDescriptor(0)]);
          while (starts.length === 0) await L.sleep(1);
          const wait = starts[0] + probeAt * duration - L.nowMs();
          if (wait > 0) await L.sleep(wait);
          await queue.addBulk(L.chunkDescriptors(1, probeJobs));
        },
      },
    });
    L.log(`limiter probe: worst sliding ${duration} ms window: ${probe.worst} starts (max ${max})`);
    out.boundary_probe = {
      jobs: probeJobs,
      burst_added_at_ms: L.round(probeAt * duration, 1),
      worst_second: probe.worst,
      worst_window_at_ms: L.round(probe.worstAtMs, 1),
      shortest_ms_for_max_plus_1_starts: L.round(probe.spanMaxPlus1, 1),
      starts_ms: probe.starts.map(t => L.round(t - probe.starts[0], 1)),
    };
  }
  await r.quit();
  L.emit(out);
}

L.run(main, 60 * 60 * 1000);
