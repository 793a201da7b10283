import { readFileSync } from "node:fs";

import { connect } from "lockservice";

// The node's certificate is verified against the CA and the host of the address
// (an IP address against an IP SAN). cert and key: this client's certificate, for mutual TLS.
const client = connect(process.env.LOCKSERVICE_ADDR ?? "127.0.0.1:7700", {
  tls: {
    ca: readFileSync(process.env.LOCKSERVICE_CA ?? "ca.pem"),
    cert: readFileSync(process.env.LOCKSERVICE_CERT ?? "client.pem"),
    key: readFileSync(process.env.LOCKSERVICE_KEY ?? "client.key"),
  },
});
const lock = await client.acquire("secrets/rotate", { lease: 30, wait: 5 });
await lock.release();
await client.close();
