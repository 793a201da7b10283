import { connect, type LockServiceError } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");
const holder = await client.acquire("printer", { lease: 30 });

// Give up after 300 ms: the pending acquire is withdrawn from the node's queue at once,
// and a grant that crossed the withdrawal is released, so no lock leaks.
try {
  await client.acquire("printer", { lease: 30, signal: AbortSignal.timeout(300) });
} catch (error) {
  console.log(`gave up: ${(error as LockServiceError).code}`); // "cancelled"
}
await holder.release();
await client.close();
