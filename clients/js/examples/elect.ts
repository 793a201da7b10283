import { connect } from "lockservice";

const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700");

// Campaign with this instance's address as the value; resolves once it leads.
const leadership = await client.campaign("scheduler", "10.0.0.5:8080", { lease: 10 });
leadership.on("lost", () => console.error("no longer the leader: stop acting as one"));
console.log(`leading with token ${leadership.token}`);

// Anyone can ask who leads.
const leader = await client.leader("scheduler");
console.log(`the leader is ${leader.value}`); // "10.0.0.5:8080"

await leadership.resign();
await client.close();
