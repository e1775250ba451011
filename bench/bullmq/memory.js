#!/usr/bin/env node
'use strict';
// Redis memory per job under BullMQ (INFO memory used_memory, before and after).
//
//  1. waiting: FLUSHALL, addBulk N jobs (jobId = natural key) -> bytes_per_waiting_job.
//  2. completed, kept (BullMQ's default: no removeOnComplete): a Worker (no limiter,
//     concurrency 50, a processor that does nothing) completes them all
//     -> bytes_per_completed_job_kept. The same N ids are then added again:
//     BullMQ ignores them (readded_after_completion: 0).
//  3. completed, removed: FLUSHALL, addBulk N jobs with removeOnComplete: true, the
//     same Worker completes them -> bytes_after_completion_removed (total, not per
//     job) and its per-job share. The same N ids are then added again: with the job
//     hash gone, BullMQ accepts every one as new (readded_after_completion: N), i.e.
//     removing completed jobs also removes the dedup at enqueue.
//
// "before" is read after FLUSHALL with BullMQ's Lua scripts already loaded and the
// queue's connection open, so neither is counted per job.
//
//   node memory.js --redis redis://127.0.0.1:PORT --jobs 100000 [--batch 100] [--concurrency 50]
//
// This script FLUSHALLs the Redis it is given: use a private one.

const bullmq = require('bullmq');
const L = require('./lib');

async function memoryUsage(r, key) {
  const v = await r.call('MEMORY', 'USAGE', key, 'SAMPLES', '0');
  return v === null ? null : Number(v);
}

async function keyBreakdown(r, sampleJobKey) {
  const prefix = `bull:${L.QUEUE}:`;
  const out = { sample_job_hash: await memoryUsage(r, prefix + sampleJobKey) };
  for (const k of ['wait', 'completed', 'events', 'meta', 'id', 'marker']) {
    const v = await memoryUsage(r, prefix + k);
    if (v !== null) out[k] = v;
  }
  out.redis_keys = await r.dbsize();
  return out;
}

async function processAll(url, n, concurrency) {
  const connection = L.connectionFromUrl(url);
  let completed = 0;
  let failed = 0;
  let resolveDone;
  const done = new Promise(resolve => (resolveDone = resolve));
  const t0 = L.nowMs();
  const worker = new bullmq.Worker(L.QUEUE, async () => {}, { connection, concurrency });
  worker.on('completed', () => {
    completed++;
    if (completed % 20000 === 0) L.log(`  processed ${completed}/${n}`);
    if (completed + failed === n) resolveDone();
  });
  worker.on('failed', () => {
    failed++;
    if (completed + failed === n) resolveDone();
  });
  worker.on('error', err => L.log(`worker error: ${err}`));
  await done;
  const seconds = (L.nowMs() - t0) / 1000;
  await worker.close();
  if (failed) throw new Error(`${failed} jobs failed`);
  return seconds;
}

// Adds the same N ids again; returns how many became new jobs.
async function readd(queue, n, batch, opts) {
  const before = await queue.count();
  await L.addAll(queue, n, batch, 4, opts, 'again');
  const after = await queue.count();
  return after - before;
}

async function main() {
  const args = L.parseArgs(process.argv.slice(2), { jobs: '100000', batch: '100', concurrency: '50' });
  const n = L.int(args.jobs, 'jobs');
  const batch = L.int(args.batch, 'batch');
  const concurrency = L.int(args.concurrency, 'concurrency');
  const connection = L.connectionFromUrl(args.redis);
  const r = L.admin(args.redis);
  await r.ping();
  const sample = L.jobId(Math.floor(n / 2));

  L.log(`memory: ${n} jobs`);
  await L.warmScripts(args.redis, bullmq);

  // 1 + 2: waiting, then completed and kept (BullMQ's default).
  await L.flushall(r);
  let queue = new bullmq.Queue(L.QUEUE, { connection });
  await queue.waitUntilReady();
  const before = await L.usedMemory(r);
  await L.addAll(queue, n, batch, 4, null, 'waiting');
  const waiting = await L.usedMemory(r);
  const waitingKeys = await keyBreakdown(r, sample);
  L.log(`memory: waiting ${L.round((waiting - before) / n, 1)} bytes/job; processing (completed jobs kept)`);
  const keptSeconds = await processAll(args.redis, n, concurrency);
  const kept = await L.usedMemory(r);
  const keptKeys = await keyBreakdown(r, sample);
  const keptCounts = await queue.getJobCounts('completed', 'wait', 'active');
  if (keptCounts.completed !== n) throw new Error(`expected ${n} completed, found ${JSON.stringify(keptCounts)}`);
  L.log(`memory: completed+kept ${L.round((kept - before) / n, 1)} bytes/job; adding the same ids again`);
  const readdedKept = await readd(queue, n, batch, null);
  await queue.close();

  // 3: completed with removeOnComplete: true.
  await L.flushall(r);
  queue = new bullmq.Queue(L.QUEUE, { connection });
  await queue.waitUntilReady();
  const before3 = await L.usedMemory(r);
  await L.addAll(queue, n, batch, 4, { removeOnComplete: true }, 'waiting (removeOnComplete)');
  const waiting3 = await L.usedMemory(r);
  L.log('memory: processing (removeOnComplete: true)');
  const removedSeconds = await processAll(args.redis, n, concurrency);
  const removed = await L.usedMemory(r);
  const removedKeys = await keyBreakdown(r, sample);
  const removedCounts = await queue.getJobCounts('completed', 'wait', 'active');
  L.log(`memory: after completion (removed) ${removed - before3} bytes in all; adding the same ids again`);
  const readdedRemoved = await readd(queue, n, batch, { removeOnComplete: true });
  await queue.close();
  await L.flushall(r);
  await r.quit();

  L.emit({
    jobs: n,
    redis_used_memory_before: before,
    redis_used_memory_waiting: waiting,
    bytes_per_waiting_job: L.round((waiting - before) / n, 1),
    // BullMQ's events stream is capped (MAXLEN ~ 10000 by default): a fixed cost of about
    // 1 MB per queue, not a per-job one; this is the per-job figure without it.
    events_stream_bytes_waiting: waitingKeys.events,
    bytes_per_waiting_job_without_events_stream: L.round((waiting - before - (waitingKeys.events || 0)) / n, 1),
    redis_used_memory_completed_kept: kept,
    bytes_per_completed_job_kept: L.round((kept - before) / n, 1),
    redis_used_memory_before_removed_run: before3,
    redis_used_memory_waiting_removed_run: waiting3,
    redis_used_memory_completed_removed: removed,
    bytes_after_completion_removed: removed - before3,
    bytes_per_job_after_completion_removed: L.round((removed - before3) / n, 2),
    process_seconds_kept: L.round(keptSeconds, 3),
    process_jobs_per_second_kept: L.round(n / keptSeconds, 1),
    process_seconds_removed: L.round(removedSeconds, 3),
    process_jobs_per_second_removed: L.round(n / removedSeconds, 1),
    readded_after_completion_kept: readdedKept,
    readded_after_completion_removed: readdedRemoved,
    counts_after_removed_run: removedCounts,
    memory_usage_bytes: { waiting: waitingKeys, completed_kept: keptKeys, completed_removed: removedKeys },
  });
}

L.run(main, 60 * 60 * 1000);
