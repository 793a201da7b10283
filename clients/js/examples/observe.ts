import { connect } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");
const worker = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700", { name: "worker-1" });

// Who holds the key now, then each change, until the loop ends or the signal aborts.
const controller = new AbortController();
const watching = (async () => {
  for await (const state of client.observe("orders/42", { signal: controller.signal })) {
    console.log(state.token === "0" ? "free" : `held by ${state.value} (token ${state.token})`);
    if (state.token !== "0") break;
  }
})();

const lock = await worker.acquire("orders/42", { lease: 10 });
await watching;
await lock.release();
console.log(await client.holder("orders/42")); // { token: "0", holder: null, ... }
await client.close();
await worker.close();
