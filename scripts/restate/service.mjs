// Restate's twins of two `settle bench` workflows, one virtual object per workflow, keyed
// like the bench's entities; each answers when its workflow is done, as Settle's raise
// with `wait=stable` does. A Settle transition (a commit) is a journaled no-op here
// (`ctx.run`, Restate's durable step) followed by the state it enters (`ctx.set`).
// - `chain/{key}/go` (`bench chain --steps N`): idle -> u1 -> ... -> uN -> done.
// - `fanparent/{key}/go` (`bench fanout --children N`): a step, then N `fanchild` objects
//   called at once (Restate's durable calls, as Settle's children are created entities)
//   and awaited together, each making its one step, then the parent's last step.
// The SDK calls `Promise.withResolvers` (Node.js 22); this machine's Node.js 20 lacks it.
if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
const restate = await import("@restatedev/restate-sdk");

const steps = Number(process.env.STEPS ?? 3);
const children = Number(process.env.CHILDREN ?? 4);
const port = Number(process.env.PORT ?? 9080);

/** One of Settle's transitions: a journaled step, then the state it enters. */
async function step(ctx, state) {
  await ctx.run(state, () => state);
  ctx.set("state", state);
}

const chain = restate.object({
  name: "chain",
  handlers: {
    go: async (ctx) => {
      for (let i = 1; i <= steps; i++) {
        await step(ctx, `u${i}`);
      }
      await step(ctx, "done");
      return "done";
    },
  },
});

const fanchild = restate.object({
  name: "fanchild",
  handlers: {
    work: async (ctx) => {
      await step(ctx, "done");
      return "done";
    },
  },
});

const fanparent = restate.object({
  name: "fanparent",
  handlers: {
    go: async (ctx) => {
      await step(ctx, "spawning");
      const calls = [];
      for (let i = 0; i < children; i++) {
        calls.push(ctx.objectClient(fanchild, `${ctx.key}-${i}`).work());
      }
      await step(ctx, "waiting");
      await restate.RestatePromise.all(calls);
      await step(ctx, "done");
      return "done";
    },
  },
});

restate.serve({ services: [chain, fanchild, fanparent], port });
