import { connect } from "lockservice";

await using client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");
{
  await using lock = await client.acquire("reports/daily", { lease: 60, wait: 10 });
  console.log(`generating the report under token ${lock.token}`);
} // released here
