import { connect } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700", { name: "billing" });

// Wait at most 5 s for the key; the grant lasts 30 s unless renewed or released.
const lock = await client.acquire("orders/42", { lease: 30, wait: 5 });
try {
  // The fencing token: a u64 as a decimal string (lock.tokenBigInt is the bigint).
  // Hand it to the protected resource, which refuses any token lower than the highest it has seen.
  console.log(`holding ${lock.key} with token ${lock.token}`);
} finally {
  await lock.release();
}
await client.close();
