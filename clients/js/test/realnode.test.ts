/**
 * The client and the driver against real lockservice nodes: a lone node, a
 * 3-node cluster (failover by kill -9, graceful handoff), TLS and mutual
 * TLS. The nodes are twistd processes: set LOCKSERVICE_TWISTD to the path
 * of a twistd that has the lockservice plugin, or these tests skip.
 */

import assert from "node:assert/strict";
import * as fs from "node:fs";
import { after, before, describe, test } from "node:test";

import { CancelledError, NoConnectionError, RejectedError, StaleError, TimeoutError, connect } from "../dist/index.js";
import { EXPECT, runExample } from "./examples-lib.js";
import { waitFor } from "./fake.js";
import { DriverProcess, RealNode, TWISTD, exchange, freePort, makeCerts, secretFile, sleep, tmpdir, type Certs } from "./helpers.js";

if (!TWISTD && process.env.CI === "true") {
  test("real-node tests need LOCKSERVICE_TWISTD under CI", () => {
    assert.fail("set LOCKSERVICE_TWISTD to a twistd with the lockservice plugin");
  });
} else if (!TWISTD) {
  test("real-node tests (set LOCKSERVICE_TWISTD to a twistd with the lockservice plugin to run them)", { skip: "LOCKSERVICE_TWISTD is not set" }, () => {});
} else {
  describe("a lone node", () => {
    let node: RealNode;

    before(async () => {
      node = new RealNode({ port: await freePort() });
      await node.ready();
    });

    after(async () => {
      await node.stop();
    });

    test("acquire, renew, release; FIFO hand-over to a waiter with a larger token", async () => {
      const a = connect(node.address, { name: "alice" });
      const b = connect(node.address, { name: "bob" });
      try {
        const held = await a.acquire("lone/fifo", { lease: 10, wait: 2 });
        assert.match(held.token, /^[0-9]+$/);
        const waiting = b.acquire("lone/fifo", { lease: 10, wait: 5 });
        await sleep(100);
        await held.renew(20);
        await held.release();
        const next = await waiting;
        assert.ok(next.tokenBigInt > held.tokenBigInt);
        await held.release(); // the same promise again
        await assert.rejects(b.release("lone/fifo", held.token), StaleError);
        await next.release();
      } finally {
        await a.close();
        await b.close();
      }
    });

    test("read locks, semaphores, and a share that does not match the key's kind", async () => {
      const c = connect(node.address);
      try {
        const readers = await Promise.all([c.readLock("lone/rw", { lease: 10, wait: 2 }), c.readLock("lone/rw", { lease: 10, wait: 2 })]);
        await assert.rejects(c.acquire("lone/rw", { lease: 10, wait: 0.3 }), TimeoutError);
        await assert.rejects(c.semaphore("lone/rw", 3, { lease: 10, wait: 0.3 }), RejectedError);
        for (const r of readers) await r.release();
        const slots = await Promise.all([1, 2, 3].map(() => c.semaphore("lone/sem", 3, { lease: 10, wait: 2 })));
        await assert.rejects(c.semaphore("lone/sem", 3, { lease: 10, wait: 0.3 }), TimeoutError);
        for (const s of slots) await s.release();
      } finally {
        await c.close();
      }
    });

    test("keep-alive holds a lock over several leases; a released token is reported lost", async () => {
      const c = connect(node.address);
      const other = connect(node.address);
      try {
        const lock = await c.acquire("lone/ka", { lease: 1, wait: 2, keepalive: true });
        let lost = false;
        lock.on("lost", () => (lost = true));
        await sleep(2500);
        assert.equal(lost, false);
        assert.equal((await other.holder("lone/ka")).token, lock.token, "still held");
        // Someone else releases it (a force-release, say): the next renewal is STALE.
        await other.release("lone/ka", lock.token);
        await waitFor(() => lost, 3000, "the lost event");
        assert.match(lock.lostError!.reason, /STALE/);
      } finally {
        await c.close();
        await other.close();
      }
    });

    test("cancel: the pending acquire is withdrawn with C, nothing leaks", async () => {
      const holder = connect(node.address, { name: "holder" });
      const c = connect(node.address, { name: "canceller" });
      const third = connect(node.address, { name: "third" });
      try {
        const held = await holder.acquire("lone/cancel", { lease: 10, wait: 2 });
        const controller = new AbortController();
        const pending = c.acquire("lone/cancel", { lease: 10, wait: 0, signal: controller.signal });
        await sleep(200);
        controller.abort();
        const error = (await pending.catch((e: unknown) => e)) as CancelledError;
        assert.ok(error instanceof CancelledError);
        await error.settled;
        const queued = third.acquire("lone/cancel", { lease: 10, wait: 5 });
        await sleep(100);
        await held.release();
        const got = await queued;
        assert.equal((await c.holder("lone/cancel")).value, "third", "granted to the third, not to the withdrawn one");
        await got.release();
      } finally {
        await holder.close();
        await c.close();
        await third.close();
      }
    });

    test("observe: the holder now and each change, with holder names", async () => {
      const watcher = connect(node.address);
      const worker = connect(node.address, { name: "worker-7" });
      const controller = new AbortController();
      try {
        const seen: Array<{ token: string; value: string | null }> = [];
        const watching = (async () => {
          for await (const state of watcher.observe("lone/obs", { signal: controller.signal })) seen.push({ token: state.token, value: state.value });
        })();
        await waitFor(() => seen.length === 1, 3000, "the first state");
        assert.deepEqual(seen[0], { token: "0", value: null });
        const lock = await worker.acquire("lone/obs", { lease: 10, wait: 2 });
        await waitFor(() => seen.length === 2, 3000, "the grant");
        assert.deepEqual(seen[1], { token: lock.token, value: "worker-7" });
        await lock.release();
        await waitFor(() => seen.length === 3, 3000, "the release");
        assert.equal(seen[2]!.token, "0");
        controller.abort();
        await assert.rejects(watching, CancelledError);
        const unchanged = await watcher.observeOnce("lone/obs", "0", 0.3);
        assert.equal(unchanged.changed, false);
      } finally {
        controller.abort();
        await watcher.close();
        await worker.close();
      }
    });

    test("elections: campaign, leader, a waiting candidate, resign", async () => {
      const a = connect(node.address, { name: "a" });
      const b = connect(node.address, { name: "b" });
      try {
        const first = await a.campaign("lone/election", "10.1.1.1:80", { lease: 3 });
        const leader = await b.leader("lone/election");
        assert.deepEqual([leader.value, leader.token], ["10.1.1.1:80", first.token]);
        const second = b.campaign("lone/election", "10.1.1.2:80", { lease: 3 });
        await sleep(200);
        await first.resign();
        const won = await second;
        assert.ok(won.tokenBigInt > first.tokenBigInt);
        assert.equal((await a.leader("lone/election")).value, "10.1.1.2:80");
        await won.resign();
        const nobody = await a.leader("lone/election");
        assert.deepEqual([nobody.value, nobody.token], [null, "0"]);
      } finally {
        await a.close();
        await b.close();
      }
    });

    test("the driver against the node", async () => {
      const driver = new DriverProcess(["--addrs", node.address, "--name", "drv"]);
      try {
        driver.send({ id: 1, op: "acquire", key: "lone/drv", lease: 10, wait: 2, share: null, keepalive: true });
        const granted = await driver.result(1);
        assert.equal(granted["ok"], true);
        driver.send({ id: 2, op: "observe", key: "lone/drv", token: "0", wait: 2 });
        const observed = await driver.result(2);
        assert.equal(observed["ok"], true);
        assert.equal(observed["token"], granted["token"]);
        assert.match(observed["holder"] as string, /^drv#[0-9a-f]{12}$/);
        driver.send({ id: 3, op: "acquire", key: "lone/drv", lease: 10, wait: 0 });
        await sleep(200);
        driver.send({ id: 4, op: "cancel", target: 3 });
        await driver.result(4);
        assert.equal(driver.out[driver.indexOf(3)]!["error"], "cancelled");
        assert.ok(driver.indexOf(3) < driver.indexOf(4));
        driver.send({ id: 5, op: "campaign", election: "lone/drv-e", value: "me", lease: 5 });
        const won = await driver.result(5);
        driver.send({ id: 6, op: "leader", election: "lone/drv-e" });
        const leader = await driver.result(6);
        assert.equal(leader["value"], "me");
        assert.equal(leader["token"], won["token"]);
        driver.send({ id: 7, op: "renew", key: "lone/drv", token: granted["token"], lease: 5 });
        assert.equal((await driver.result(7))["ok"], true);
        driver.send({ id: 8, op: "close" });
        assert.equal(await driver.exited, 0);
        assert.deepEqual(driver.out[driver.out.length - 1], { id: 8, ok: true });
        const check = connect(node.address);
        try {
          assert.equal((await check.holder("lone/drv")).token, "0", "released at close");
          assert.equal((await check.leader("lone/drv-e")).token, "0", "resigned at close");
        } finally {
          await check.close();
        }
      } finally {
        await driver.kill();
      }
    });

    test("the README's examples run against the node", async () => {
      for (const [name, patterns] of Object.entries(EXPECT)) {
        if (name === "tls") continue; // TLS nodes: below
        const result = await runExample(name, { LOCKSERVICE_ADDR: node.address });
        assert.equal(result.code, 0, `${name}: exit ${result.code}: ${result.stderr}`);
        for (const p of patterns) assert.match(result.stdout, p, name);
      }
    });

    test("a paused node: an acquire with a wait ends within 3 s of the wait; a release within its 5 s", async () => {
      const c = connect(node.address);
      try {
        const lock = await c.acquire("lone/paused", { lease: 30, wait: 2 });
        node.proc.kill("SIGSTOP");
        try {
          const started = performance.now();
          const [acquired, released] = await Promise.allSettled([c.acquire("lone/paused2", { lease: 5, wait: 1 }), lock.release()]);
          const took = performance.now() - started;
          assert.equal(acquired.status, "rejected");
          assert.ok((acquired as PromiseRejectedResult).reason instanceof TimeoutError || (acquired as PromiseRejectedResult).reason instanceof NoConnectionError);
          assert.equal(released.status, "rejected");
          assert.ok((released as PromiseRejectedResult).reason instanceof NoConnectionError);
          assert.ok(took < 6500, `took ${took} ms`);
        } finally {
          node.proc.kill("SIGCONT");
        }
        await c.whenConnected(10);
        const after = await c.acquire("lone/after-pause", { lease: 5, wait: 5 });
        await after.release();
      } finally {
        await c.close();
      }
    });
  });

  describe("a 3-node cluster", () => {
    let nodes: RealNode[];
    let dir: string;

    before(async () => {
      dir = tmpdir();
      const secret = secretFile(dir);
      const ports = [await freePort(), await freePort(), await freePort()];
      nodes = ports.map((port) => new RealNode({ port, peers: ports, secret }));
      await Promise.all(nodes.map((n) => n.ready()));
    });

    after(async () => {
      await Promise.all(nodes.map((n) => n.stop("SIGKILL")));
      fs.rmSync(dir, { recursive: true, force: true });
    });

    test("standbys redirect (M) to the active", async () => {
      const raw = await exchange(nodes[1]!.port, ["A cl/raw 5 1"], 800);
      assert.ok(raw.some((l) => l === `M A cl/raw ${nodes[0]!.address}` || l === "M A cl/raw *"), raw.join("|"));
      const c = connect(nodes[2]!.address);
      try {
        const lock = await c.acquire("cl/redirect", { lease: 10, wait: 5 });
        await lock.release();
      } finally {
        await c.close();
      }
    });

    test("kill -9 of the active: the client moves to the new active; the held lock survives; then a graceful handoff", async () => {
      const c = connect(nodes.map((n) => n.address), { name: "survivor" });
      try {
        const kept = await c.acquire("cl/kept", { lease: 30, wait: 5 });
        const alive = await c.acquire("cl/alive", { lease: 3, wait: 5, keepalive: true });
        let lost = false;
        alive.on("lost", () => (lost = true));
        await sleep(300); // replicated
        nodes[0]!.proc.kill("SIGKILL");
        await nodes[0]!.exited;
        const started = performance.now();
        const after = await c.acquire("cl/after-failover", { lease: 10, wait: 10 });
        const took = performance.now() - started;
        assert.ok(took < 8000, `first grant after ${took} ms`);
        assert.ok(after.tokenBigInt > kept.tokenBigInt);
        assert.equal((await c.holder("cl/kept")).token, kept.token, "the held lock was replicated");
        await kept.release(); // OK on the new active, not STALE
        await after.release();
        // Graceful handoff: SIGTERM of the new active (node 1) hands over to node 2.
        await nodes[1]!.stop("SIGTERM");
        const handed = await c.acquire("cl/after-handoff", { lease: 10, wait: 10 });
        await handed.release();
        await sleep(1000);
        assert.equal(lost, false, "the kept-alive lock lived through the failover and the handoff");
        assert.equal((await c.holder("cl/alive")).token, alive.token);
        await alive.release();
      } finally {
        await c.close();
      }
    });
  });

  describe("TLS nodes", () => {
    let certs: Certs;
    let plain: RealNode;
    let mutual: RealNode;

    before(async () => {
      certs = makeCerts();
      plain = new RealNode({ port: await freePort(), tls: { cert: certs.nodeCert, key: certs.nodeKey } });
      mutual = new RealNode({ port: await freePort(), tls: { cert: certs.nodeCert, key: certs.nodeKey, ca: certs.ca } });
      const ca = fs.readFileSync(certs.ca);
      await plain.ready(20_000, { ca });
      await mutual.ready(20_000, { ca, cert: fs.readFileSync(certs.clientCert), key: fs.readFileSync(certs.clientKey) });
    });

    after(async () => {
      await plain.stop();
      await mutual.stop();
      fs.rmSync(certs.dir, { recursive: true, force: true });
    });

    test("TLS: verified against the CA and the IP address", async () => {
      const c = connect(plain.address, { tls: { ca: fs.readFileSync(certs.ca) } });
      const untrusting = connect(plain.address, { tls: true });
      try {
        await (await c.acquire("tls/k", { lease: 5, wait: 2 })).release();
        await assert.rejects(untrusting.acquire("tls/k", { lease: 5, wait: 2 }), NoConnectionError);
      } finally {
        await c.close();
        await untrusting.close();
      }
    });

    test("mutual TLS: a client certificate is needed", async () => {
      const ca = fs.readFileSync(certs.ca);
      const good = connect(mutual.address, { tls: { ca, cert: fs.readFileSync(certs.clientCert), key: fs.readFileSync(certs.clientKey) } });
      const none = connect(mutual.address, { tls: { ca } });
      const driver = new DriverProcess(["--addrs", mutual.address, "--tls-ca", certs.ca, "--tls-cert", certs.clientCert, "--tls-key", certs.clientKey]);
      try {
        await (await good.acquire("mtls/k", { lease: 5, wait: 2 })).release();
        await assert.rejects(none.acquire("mtls/k", { lease: 5, wait: 2 }), NoConnectionError);
        driver.send({ id: 1, op: "acquire", key: "mtls/d", lease: 5, wait: 2 });
        assert.equal((await driver.result(1))["ok"], true);
        const example = await runExample("tls", { LOCKSERVICE_ADDR: mutual.address, LOCKSERVICE_CA: certs.ca, LOCKSERVICE_CERT: certs.clientCert, LOCKSERVICE_KEY: certs.clientKey });
        assert.equal(example.code, 0, example.stderr);
      } finally {
        await good.close();
        await none.close();
        await driver.kill();
      }
    });
  });
}
