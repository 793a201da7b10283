/**
 * TLS against the fake node: the node verified against the CA and the host
 * given in the address; client certificates for mutual TLS.
 */

import assert from "node:assert/strict";
import * as fs from "node:fs";
import { after, before, describe, test } from "node:test";

import { NoConnectionError, connect } from "../dist/index.js";
import { FakeServer } from "./fake.js";
import { DriverProcess, makeCerts, type Certs } from "./helpers.js";

let certs: Certs;
const read = (f: string): Buffer => fs.readFileSync(f);

before(() => {
  certs = makeCerts();
});

after(() => {
  fs.rmSync(certs.dir, { recursive: true, force: true });
});

async function tlsFake(cert: "node" | "other", mutual = false): Promise<FakeServer> {
  return FakeServer.start({
    tls: {
      cert: read(cert === "node" ? certs.nodeCert : certs.otherCert),
      key: read(cert === "node" ? certs.nodeKey : certs.otherKey),
      ...(mutual ? { ca: read(certs.ca), requestCert: true, rejectUnauthorized: true } : {}),
    },
  });
}

describe("TLS", { concurrency: true }, () => {
  test("the node's certificate is verified against the CA and the IP address (an IP SAN)", async (t) => {
    const fake = await tlsFake("node");
    const client = connect(fake.address, { tls: { ca: read(certs.ca) }, name: "tls" });
    t.after(async () => {
      await client.close();
      await fake.close();
    });
    const lock = await client.acquire("secure", { lease: 5, wait: 2 });
    await lock.release();
    assert.equal(fake.linesMatching(/^A secure 5 2$/).length, 1);
    assert.match(fake.received[0]!.line, /^I tls#/);
  });

  test("a host name is verified against a DNS SAN", async (t) => {
    const fake = await tlsFake("node");
    const client = connect(`localhost:${fake.port}`, { tls: { ca: read(certs.ca) } });
    t.after(async () => {
      await client.close();
      await fake.close();
    });
    await client.whenConnected(5);
    await (await client.acquire("named", { lease: 5, wait: 2 })).release();
  });

  test("a certificate for another host is refused: no_connection", async (t) => {
    const fake = await tlsFake("other");
    const client = connect(fake.address, { tls: { ca: read(certs.ca) } });
    t.after(async () => {
      await client.close();
      await fake.close();
    });
    const error = await client.acquire("k", { lease: 5, wait: 2 }).catch((e: unknown) => e);
    assert.ok(error instanceof NoConnectionError, String(error));
    assert.match(error.message, /other\.example|altnames|IP/i);
    assert.equal(fake.linesMatching(/^A /).length, 0);
  });

  test("a node whose CA is not trusted is refused", async (t) => {
    const fake = await tlsFake("node");
    const client = connect(fake.address, { tls: true });
    t.after(async () => {
      await client.close();
      await fake.close();
    });
    await assert.rejects(client.acquire("k", { lease: 5, wait: 2 }), NoConnectionError);
  });

  test("mutual TLS: with the client certificate it works, without one or with a stranger's it does not", async (t) => {
    const fake = await tlsFake("node", true);
    const good = connect(fake.address, { tls: { ca: read(certs.ca), cert: read(certs.clientCert), key: read(certs.clientKey) } });
    const none = connect(fake.address, { tls: { ca: read(certs.ca) } });
    const stranger = connect(fake.address, { tls: { ca: read(certs.ca), cert: read(certs.strangerCert), key: read(certs.strangerKey) } });
    t.after(async () => {
      await Promise.all([good.close(), none.close(), stranger.close()]);
      await fake.close();
    });
    await (await good.acquire("m", { lease: 5, wait: 2 })).release();
    await assert.rejects(none.acquire("m2", { lease: 5, wait: 2 }), NoConnectionError);
    await assert.rejects(stranger.acquire("m3", { lease: 5, wait: 2 }), NoConnectionError);
    assert.equal(fake.linesMatching(/^A m[23] /).length, 0);
  });

  test("the driver's --tls-ca, --tls-cert, --tls-key", async (t) => {
    const fake = await tlsFake("node", true);
    const driver = new DriverProcess(["--addrs", fake.address, "--tls-ca", certs.ca, "--tls-cert", certs.clientCert, "--tls-key", certs.clientKey]);
    const bare = new DriverProcess(["--addrs", fake.address, "--tls-ca", certs.ca]);
    t.after(async () => {
      await driver.kill();
      await bare.kill();
      await fake.close();
    });
    driver.send({ id: 1, op: "acquire", key: "d", lease: 5, wait: 2 });
    assert.equal((await driver.result(1))["ok"], true);
    bare.send({ id: 1, op: "acquire", key: "d2", lease: 5, wait: 2 });
    assert.equal((await bare.result(1))["error"], "no_connection");
  });
});
