// Restate's twin of `settle bench chain --steps N`: one virtual object per workflow, keyed
// like the bench's entities. `go` walks idle -> u1 -> ... -> uN -> done, each step a
// journaled no-op (`ctx.run`, Restate's durable step, as each of Settle's transitions is
// a commit) followed by the state it enters (`ctx.set`), and answers when done, as
// Settle's raise with `wait=stable` does.
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
const port = Number(process.env.PORT ?? 9080);

const chain = restate.object({
  name: "chain",
  handlers: {
    go: async (ctx) => {
      for (let i = 1; i <= steps; i++) {
        await ctx.run(`u${i}`, () => i);
        ctx.set("state", `u${i}`);
      }
      ctx.set("state", "done");
      return "done";
    },
  },
});

restate.serve({ services: [chain], port });
