// Drives `{OBJECT}/{key}/go` (`chain` or `fanparent`, service.mjs) through Restate's
// ingress as `settle bench chain` and `bench fanout` drive their entities: WORKFLOWS keys,
// CONCURRENCY calls in flight, each call waits for its answer. Prints one JSON line:
// workflows/s and the calls' p50 and p99 in ms.
const ingress = process.env.INGRESS ?? "http://127.0.0.1:8080";
const workflows = Number(process.env.WORKFLOWS ?? 20000);
const concurrency = Number(process.env.CONCURRENCY ?? 64);
const object = process.env.OBJECT ?? "chain";
const run = Math.random().toString(16).slice(2, 10);

let next = 0;
const latencies = [];
async function worker() {
  for (;;) {
    const i = next++;
    if (i >= workflows) return;
    const t = performance.now();
    const r = await fetch(`${ingress}/${object}/c${run}-${i}/go`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "null",
    });
    const body = await r.text();
    if (!r.ok || body !== '"done"') throw new Error(`workflow ${i}: ${r.status} ${body}`);
    latencies.push(performance.now() - t);
  }
}
const started = performance.now();
await Promise.all(Array.from({ length: Math.min(concurrency, workflows) }, worker));
const seconds = (performance.now() - started) / 1000;
latencies.sort((a, b) => a - b);
const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))];
console.log(JSON.stringify({
  system: "restate",
  object,
  workflows,
  concurrency,
  seconds: +seconds.toFixed(3),
  workflows_per_s: +(workflows / seconds).toFixed(1),
  p50_ms: +pct(0.5).toFixed(3),
  p99_ms: +pct(0.99).toFixed(3),
}));
