import { connect, LockServiceError, TimeoutError } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");
const held = await client.acquire("inventory", { lease: 30 });
try {
  await client.acquire("inventory", { lease: 30, wait: 0.2 });
} catch (error) {
  if (error instanceof TimeoutError) console.log("busy: try later");
  else if (error instanceof LockServiceError) console.log(`failed: ${error.code}`);
  else throw error;
}
try {
  await client.acquire("has a space", { lease: 30 });
} catch (error) {
  console.log((error as LockServiceError).code); // "invalid": refused before sending
}
await held.release();
await client.close();
