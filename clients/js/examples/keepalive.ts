import { connect } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");

// Renewed every third of the lease for as long as the lock is held.
const lock = await client.acquire("jobs/reindex", { lease: 15, wait: 5, keepalive: true });
lock.on("lost", (error) => {
  // A renewal was refused, or the lease ran out while renewals failed: stop working.
  console.error(error.message);
});
try {
  // lock.signal is aborted the moment the lock is lost: hand it to the work.
  await doWork(lock.signal);
} finally {
  await lock.release();
  await client.close();
}

async function doWork(signal: AbortSignal): Promise<void> {
  for (let step = 0; step < 3 && !signal.aborted; step++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  console.log(signal.aborted ? "stopped: the lock was lost" : "work done");
}
