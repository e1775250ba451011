#!/usr/bin/env node
'use strict';
// BullMQ fan-out: queue.addBulk of N jobs (jobId = the natural dedup key), in chunks of
// --batch, one producer. Measured twice on a FLUSHALL'd Redis: awaiting each addBulk
// (1 chunk in flight) and with 4 chunks in flight; the better is reported at the top
// level (`mode` says which), both under `modes`. Then the same N ids are added again
// to the same Redis: BullMQ must ignore every one (the job count stays N).
//
//   node enqueue.js --redis redis://127.0.0.1:PORT --jobs 300000 [--batch 100] [--in-flight 4]
//
// This script FLUSHALLs the Redis it is given: use a private one.

const bullmq = require('bullmq');
const L = require('./lib');

async function main() {
  const args = L.parseArgs(process.argv.slice(2), { jobs: '300000', batch: '100', 'in-flight': '4' });
  const n = L.int(args.jobs, 'jobs');
  const batch = L.int(args.batch, 'batch');
  const concurrent = L.int(args['in-flight'], 'in-flight');
  const connection = L.connectionFromUrl(args.redis);
  const r = L.admin(args.redis);
  await r.ping();

  L.log(`enqueue: ${n} jobs, addBulk chunks of ${batch}, BullMQ ${require('bullmq/package.json').version}`);
  await L.warmScripts(args.redis, bullmq);
  {
    // Warm V8 (and the connection) on the same code path, unmeasured, then flush.
    const q = new bullmq.Queue(L.QUEUE, { connection });
    await L.addAll(q, Math.min(n, 5000), batch, 1, null, null);
    await q.close();
  }

  const modes = {};
  let queue = null;
  for (const inFlight of [1, concurrent]) {
    const name = inFlight === 1 ? 'sequential' : `in_flight_${inFlight}`;
    if (queue) await queue.close();
    await L.flushall(r);
    queue = new bullmq.Queue(L.QUEUE, { connection });
    await queue.waitUntilReady();
    const memBefore = await L.usedMemory(r);
    const cpuBefore = await L.redisCpuSeconds(r);
    const busyBefore = L.machineBusySeconds();
    const ownBefore = L.ownCpuSeconds();
    L.log(`enqueue [${name}]: adding ${n} jobs, ${inFlight} chunk(s) of ${batch} in flight`);
    const seconds = await L.addAll(queue, n, batch, inFlight, null, name);
    const ownAfter = L.ownCpuSeconds();
    const busyAfter = L.machineBusySeconds();
    const cpuAfter = await L.redisCpuSeconds(r);
    const memAfter = await L.usedMemory(r);
    const waiting = await queue.getWaitingCount();
    if (waiting !== n) throw new Error(`[${name}] expected ${n} waiting jobs, found ${waiting}`);
    modes[name] = {
      in_flight: inFlight,
      seconds: L.round(seconds, 3),
      jobs_per_second: L.round(n / seconds, 1),
      redis_cpu_seconds: L.round(cpuAfter - cpuBefore, 2),
      node_cpu_seconds: L.round(ownAfter - ownBefore, 2),
      // CPU that neither this producer nor Redis used during the run (other processes
      // on the machine): near 0 on a quiet machine; large means a contended figure.
      other_cpu_seconds: busyBefore === null ? null
        : L.round(busyAfter - busyBefore - (ownAfter - ownBefore) - (cpuAfter - cpuBefore), 2),
      redis_used_memory_before: memBefore,
      redis_used_memory_after: memAfter,
      bytes_per_job: L.round((memAfter - memBefore) / n, 1),
    };
    L.log(`enqueue [${name}]: ${modes[name].seconds} s, ${modes[name].jobs_per_second} jobs/s, ` +
      `${modes[name].bytes_per_job} bytes/job`);
  }

  const best = Object.keys(modes).reduce((a, b) => (modes[b].jobs_per_second > modes[a].jobs_per_second ? b : a));

  // Second run on the same ids, on the Redis left by the last mode (all N waiting).
  const dupInFlight = modes[best].in_flight;
  const countBefore = await queue.count();
  const keysBefore = await r.dbsize();
  const memBefore2 = await L.usedMemory(r);
  L.log(`enqueue [again]: adding the same ${n} ids again (${dupInFlight} chunk(s) in flight)`);
  const dupSeconds = await L.addAll(queue, n, batch, dupInFlight, null, 'again');
  const countAfter = await queue.count();
  const keysAfter = await r.dbsize();
  const memAfter2 = await L.usedMemory(r);
  const added = countAfter - countBefore;
  if (countAfter !== n) throw new Error(`after the second run: expected ${n} jobs, found ${countAfter}`);
  await queue.close();
  await r.quit();

  L.emit({
    jobs: n,
    batch,
    mode: best,
    seconds: modes[best].seconds,
    jobs_per_second: modes[best].jobs_per_second,
    redis_cpu_seconds: modes[best].redis_cpu_seconds,
    node_cpu_seconds: modes[best].node_cpu_seconds,
    other_cpu_seconds: modes[best].other_cpu_seconds,
    redis_used_memory_before: modes[best].redis_used_memory_before,
    redis_used_memory_after: modes[best].redis_used_memory_after,
    bytes_per_job: modes[best].bytes_per_job,
    modes,
    second_run: {
      jobs_offered: n,
      jobs_before: countBefore,
      jobs_after: countAfter,
      redis_keys_before: keysBefore,
      redis_keys_after: keysAfter,
      seconds: L.round(dupSeconds, 3),
      offered_per_second: L.round(n / dupSeconds, 1),
      redis_used_memory_delta: memAfter2 - memBefore2,
    },
    duplicates_ignored: n - added,
  });
}

L.run(main, 30 * 60 * 1000);
