import { connect } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");

// Read locks: any number of readers at once, no writer meanwhile.
const readers = await Promise.all([
  client.readLock("catalog", { lease: 10 }),
  client.readLock("catalog", { lease: 10 }),
]);
// A writer is an exclusive acquire of the same key: it waits for the readers.
const writer = client.acquire("catalog", { lease: 10, wait: 5 });
await Promise.all(readers.map((reader) => reader.release()));
await (await writer).release();

// A semaphore: at most 3 holders of "gpu" at once (every acquirer says 3).
const slot = await client.semaphore("gpu", 3, { lease: 10 });
await slot.release();
await client.close();
