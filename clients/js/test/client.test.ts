/**
 * The client against the fake node: exact lines on the wire.
 */

import assert from "node:assert/strict";
import { describe, test, type TestContext } from "node:test";

import {
  CancelledError,
  Client,
  InvalidError,
  LockLostError,
  NoConnectionError,
  RejectedError,
  StaleError,
  TimeoutError,
  connect,
  type ConnectOptions,
} from "../dist/index.js";
import { FakeServer, waitFor, type FakeConn } from "./fake.js";
import { freePort, sleep } from "./helpers.js";

const INSTANCE = /^I t#[0-9a-f]{12}$/;

async function fakeAndClient(t: TestContext, options: ConnectOptions & { single?: boolean } = {}): Promise<{ fake: FakeServer; client: Client }> {
  const fake = await FakeServer.start();
  // `single`: a second address where nothing listens, so one connection carries everything.
  const addrs = options.single ? [fake.address, `127.0.0.1:${await freePort()}`] : fake.address;
  const client = connect(addrs, { name: "t", ...options });
  t.after(async () => {
    await client.close();
    await fake.close();
  });
  await client.whenConnected(5);
  if (!options.single) await waitFor(() => fake.live.length === 2 && fake.live.every((c) => c.name !== null), 5000, "two connections");
  return { fake, client };
}

/** Lines received for `op`, as "connId: line". */
function wire(fake: FakeServer, re: RegExp): string[] {
  return fake.linesMatching(re).map((r) => r.line);
}

describe("connections", { concurrency: true }, () => {
  test("two connections to a single address, each named <name>#<instance> first", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    assert.equal(fake.live.length, 2);
    const names = fake.live.map((c) => c.lines[0]);
    for (const first of names) assert.match(first!, INSTANCE);
    assert.equal(names[0], names[1], "one instance id per client");
    assert.equal(names[0], `I ${client.wireName}`);
  });

  test("one connection per address when given several", async (t) => {
    const fakes = [await FakeServer.start(), await FakeServer.start(), await FakeServer.start()];
    const client = connect(fakes.map((f) => f.address), { name: "t" });
    t.after(async () => {
      await client.close();
      for (const f of fakes) await f.close();
    });
    await waitFor(() => fakes.every((f) => f.live.length === 1 && f.live[0]!.name !== null), 5000, "a connection to each");
    await sleep(200);
    for (const f of fakes) assert.equal(f.conns.length, 1);
  });

  test("requests go round-robin over the connections", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    for (let i = 0; i < 4; i++) await (await client.acquire(`rr${i}`, { lease: 5 })).release();
    const conns = fake.linesMatching(/^[AR] rr/).map((r) => r.conn.id);
    assert.equal(conns.length, 8);
    for (let i = 1; i < conns.length; i++) assert.notEqual(conns[i], conns[i - 1], `request ${i} on the other connection`);
  });

  test("a dropped connection is redialled, and a failed attempt retried every 3 s", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const dropAt = performance.now();
    fake.slam = true; // from now on every attempt fails (accepted, closed at once)
    fake.dropAll();
    await waitFor(() => fake.accepts.length >= 2 + 4, 12_000, "four more attempts");
    const attempts = fake.accepts.slice(2);
    // Two slots, each: an attempt at most 3 s after its previous one began, then every 3 s.
    assert.ok(attempts[0]! - dropAt < 3300, `first redial after ${attempts[0]! - dropAt} ms`);
    const sorted = [...attempts].sort((a, b) => a - b);
    // Each slot attempts every 3 s: in any 2.5 s window there are at most two attempts (one per slot).
    for (let i = 0; i + 2 < sorted.length; i++) {
      assert.ok(sorted[i + 2]! - sorted[i]! > 2500, `three attempts within ${sorted[i + 2]! - sorted[i]!} ms`);
    }
    assert.ok(!client.pool.up);
    fake.slam = false;
    await client.whenConnected(5);
    const lock = await client.acquire("back", { lease: 5, wait: 2 });
    await lock.release();
  });

  test("with no node reachable an acquire fails no_connection after trying every address once", async (t) => {
    const client = connect([`127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`]);
    t.after(() => client.close());
    const started = performance.now();
    await assert.rejects(client.acquire("k", { lease: 5, wait: 0 }), NoConnectionError);
    assert.ok(performance.now() - started < 3000);
  });
});

describe("pipelining and pairing", { concurrency: true }, () => {
  test("answers out of order are paired by (op, key)", async (t) => {
    const { fake, client } = await fakeAndClient(t, { single: true });
    fake.hook = (_c, line) => line.startsWith("A ");
    const one = client.acquire("one", { lease: 5 });
    const two = client.acquire("two", { lease: 5 });
    const a1 = await fake.waitLine((l) => l.startsWith("A one "));
    const a2 = await fake.waitLine((l) => l.startsWith("A two "));
    assert.equal(a1.conn, a2.conn, "pipelined on one connection");
    a1.conn.send("A two 200");
    a1.conn.send("A one 100");
    assert.equal((await one).token, "100");
    assert.equal((await two).token, "200");
  });

  test("equal (op, key) pairs are answered in send order", async (t) => {
    const { fake, client } = await fakeAndClient(t, { single: true });
    fake.hook = (_c, line) => line.startsWith("R ");
    const first = client.release("k", "1");
    const second = client.release("k", "2");
    const r1 = await fake.waitLine((l) => l === "R k 1");
    await fake.waitLine((l) => l === "R k 2");
    r1.conn.send("R k OK");
    r1.conn.send("R k STALE");
    await first;
    await assert.rejects(second, StaleError);
  });

  test("at most one outstanding A per key per connection; the next waits its turn", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.hook = (_c, line) => line.startsWith("A same ");
    const acquires = [0, 1, 2].map(() => client.acquire("same", { lease: 5 }));
    const first = await fake.waitLine((l) => l.startsWith("A same "));
    const second = await fake.waitLine((l) => l.startsWith("A same "), 5000, first.index + 1);
    assert.notEqual(first.conn, second.conn, "the second goes on the other connection");
    await sleep(300);
    assert.equal(wire(fake, /^A same /).length, 2, "the third waits");
    first.conn.send("A same 11");
    const third = await fake.waitLine((l) => l.startsWith("A same "), 5000, second.index + 1);
    assert.equal(third.conn, first.conn, "on the connection whose A was answered");
    second.conn.send("A same 12");
    third.conn.send("A same 13");
    const tokens = (await Promise.all(acquires)).map((l) => l.token).sort();
    assert.deepEqual(tokens, ["11", "12", "13"]);
  });

  test("at most one outstanding O per key per connection", async (t) => {
    const { fake, client } = await fakeAndClient(t, { single: true });
    fake.hook = (_c, line) => line.startsWith("O ");
    const a = client.observeOnce("obs", "5", 3);
    const b = client.observeOnce("obs", "5", 3);
    const first = await fake.waitLine((l) => l.startsWith("O obs "));
    assert.equal(first.line, "O obs 5 3");
    await sleep(300);
    assert.equal(wire(fake, /^O obs /).length, 1);
    first.conn.send("O obs 6 x#1");
    assert.deepEqual(await a, { token: "6", tokenBigInt: 6n, holder: "x#1", value: "x", changed: true });
    const second = await fake.waitLine((l) => l.startsWith("O obs "), 5000, first.index + 1);
    second.conn.send("O obs 7 -");
    assert.equal((await b).token, "7");
  });
});

describe("acquire", { concurrency: true }, () => {
  test("the request on the wire: lease, wait and share in the seconds grammar", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    await (await client.acquire("g1", { lease: 0.5, wait: 1e-7 })).release();
    await (await client.acquire("g2", { lease: 30, wait: 2.5, share: "r" })).release();
    await (await client.acquire("g3", { lease: 1e-9, wait: 0, share: 3 })).release().catch(() => {});
    await (await client.acquire("g4", { lease: 10, share: 1 })).release();
    assert.deepEqual(wire(fake, /^A g/), ["A g1 0.5 0.000001", "A g2 30 2.5 r", "A g3 0.000001 0 3", "A g4 10 0"]);
  });

  test("tokens are u64 decimal strings, never numbers", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.hook = (c, line) => {
      if (line.startsWith("A big ")) {
        c.send("A big 18446744073709551615");
        return true;
      }
      return false;
    };
    const lock = await client.acquire("big", { lease: 5 });
    assert.equal(lock.token, "18446744073709551615");
    assert.equal(lock.tokenBigInt, 18446744073709551615n);
    await assert.rejects(lock.release(), StaleError);
    assert.deepEqual(wire(fake, /^R big/), ["R big 18446744073709551615"]);
  });

  test("T is a timeout; E is rejected; a bad request is refused before sending", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const held = await client.acquire("busy", { lease: 5, share: 3 });
    await assert.rejects(client.acquire("busy", { lease: 5, wait: 0.2 }), (e: unknown) => e instanceof RejectedError && e.code === "rejected");
    const x = await client.acquire("x", { lease: 5 });
    await assert.rejects(client.acquire("x", { lease: 5, wait: 0.2 }), (e: unknown) => e instanceof TimeoutError && e.code === "timeout");
    await x.release();
    await held.release();
    const before = fake.received.length;
    await assert.rejects(client.acquire("a b", { lease: 5 }), InvalidError);
    await assert.rejects(client.acquire("k", { lease: 0 }), { code: "invalid" });
    await assert.rejects(client.acquire("k", { lease: 5, wait: -1 }), { code: "invalid" });
    await assert.rejects(client.acquire("k", { lease: 5, share: "w" as "r" }), { code: "invalid" });
    await assert.rejects(client.acquire("k", { lease: 5, share: 70000 }), { code: "invalid" });
    assert.equal(fake.received.length, before, "nothing sent");
  });

  test("read locks and semaphores", async (t) => {
    const { client } = await fakeAndClient(t);
    const r1 = await client.readLock("rw", { lease: 5 });
    const r2 = await client.readLock("rw", { lease: 5, wait: 1 });
    await assert.rejects(client.acquire("rw", { lease: 5, wait: 0.2 }), TimeoutError);
    await r1.release();
    await r2.release();
    const s = await Promise.all([client.semaphore("sem", 2, { lease: 5 }), client.semaphore("sem", 2, { lease: 5 })]);
    await assert.rejects(client.semaphore("sem", 2, { lease: 5, wait: 0.2 }), TimeoutError);
    await Promise.all(s.map((l) => l.release()));
    assert.equal(s[0]!.share, 2);
  });

  test("a dropped connection moves the acquire to the next one", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    let drops = 0;
    fake.hook = (c, line) => {
      if (line.startsWith("A moving ") && drops === 0) {
        drops++;
        c.destroy();
        return true;
      }
      return false;
    };
    const lock = await client.acquire("moving", { lease: 5, wait: 3 });
    const lines = fake.linesMatching(/^A moving /);
    assert.equal(lines.length, 2);
    assert.notEqual(lines[0]!.conn, lines[1]!.conn);
    // The re-sent request asks only for the wait that is left.
    assert.match(lines[1]!.line, /^A moving 5 (2\.[0-9]+|3)$/);
    await lock.release();
  });

  test("after as many drops as connections the acquire fails no_connection", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.hook = (c, line) => {
      if (line.startsWith("A doomed ")) {
        c.destroy();
        return true;
      }
      return false;
    };
    await assert.rejects(client.acquire("doomed", { lease: 5, wait: 3 }), NoConnectionError);
    // The two first connections drop in one moment: one try (the node
    // could have died); a connection made after it is the second.
    const sent = fake.linesMatching(/^A doomed /);
    assert.equal(sent.length, 3);
    assert.equal(new Set(sent.map((r) => r.conn.id)).size, 3);
  });

  for (const what of ["acquire", "observe"] as const) {
    test(`the connections of a node that dies together are one try: a pending ${what} goes on`, async (t) => {
      const { fake, client } = await fakeAndClient(t);
      const prefix = what === "acquire" ? "A died " : "O died ";
      // The node dies when the request arrives: its connections drop, the
      // second a moment after the first (the client re-sends on it before
      // it sees that drop). Connections made after that are served.
      let dead = false;
      let victims: FakeConn[] = [];
      fake.hook = (c, line) => {
        if (!line.startsWith(prefix)) return false;
        if (victims.includes(c)) return true;
        if (dead) return false;
        dead = true;
        victims = [...fake.live];
        c.destroy();
        for (const other of victims) if (other !== c) setTimeout(() => other.destroy(), 30);
        return true;
      };
      if (what === "acquire") {
        const lock = await client.acquire("died", { lease: 5, wait: 0 });
        assert.equal(fake.model.newest("died").token.toString(), lock.token);
        await lock.release();
      } else {
        const pending = client.observeOnce("died", "0", 0);
        await waitFor(() => victims.length > 0 && victims.every((v) => v.closed) && fake.live.length > 0, 5000, "the node back");
        await waitFor(() => fake.linesMatching(/^O died /).some((r) => !victims.includes(r.conn)), 5000, "the observe re-sent");
        const token = fake.model.grantTo("died", "w#1");
        const state = await pending;
        assert.equal(state.token, token.toString());
      }
      const sent = fake.linesMatching(new RegExp(`^${prefix}`));
      assert.ok(sent.length >= 2 && sent.some((r) => !victims.includes(r.conn)), sent.map((r) => `${r.conn.id}: ${r.line}`).join(", "));
    });
  }

  test("waits and leases beyond 24.8 days (a 32-bit millisecond timer) do not end early", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.model.grantTo("long", "other#1");
    const long = 2_500_000; // seconds: 2.5e9 ms > 2^31-1
    const events: string[] = [];
    const waiting = client.acquire("long", { lease: 5, wait: long }).then(
      (lock) => (events.push("granted"), lock),
      (e: unknown) => (events.push(`acquire failed: ${String(e)}`), null),
    );
    const observing = client.observeOnce("long", fake.model.newest("long").token, long).then(
      () => events.push("observed"),
      (e: unknown) => events.push(`observe failed: ${String(e)}`),
    );
    const kept = await client.acquire("kept", { lease: long, wait: long, keepalive: true });
    const plain = await client.acquire("plain", { lease: long, wait: 5 });
    for (const lock of [kept, plain]) lock.on("lost", (e) => events.push(`lost ${lock.key}: ${e.message}`));
    await sleep(500);
    assert.deepEqual(events, []);
    assert.equal(kept.validFor > long - 10, true);
    assert.equal(fake.linesMatching(/^N kept /).length, 0, "no renewal yet");
    fake.model.releaseToken("long", fake.model.newest("long").token);
    const lock = await waiting;
    await observing;
    assert.deepEqual(events.sort(), ["granted", "observed"]);
    for (const l of [lock!, kept, plain]) await l.release();
  });

  test("a node that never answers: an acquire with a wait ends at most 3 s after the wait", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.silent = true;
    const started = performance.now();
    await assert.rejects(client.acquire("stall", { lease: 5, wait: 1 }), (e: unknown) => e instanceof TimeoutError || e instanceof NoConnectionError);
    const took = performance.now() - started;
    assert.ok(took >= 1000 && took <= 4000, `took ${took} ms`);
  });

  test("await using releases the lock at the end of the block", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    let token: string;
    {
      await using lock = await client.acquire("scoped", { lease: 5 });
      token = lock.token;
      assert.equal(fake.linesMatching(/^R scoped/).length, 0);
    }
    assert.deepEqual(wire(fake, /^R scoped/), [`R scoped ${token}`]);
    assert.equal(fake.model.keys.has("scoped"), false);
  });
});

describe("cancel", { concurrency: true }, () => {
  test("aborting a pending acquire sends C key at once on its connection; T then C OK end it", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.model.grantTo("c1", "other#1");
    const controller = new AbortController();
    const pending = client.acquire("c1", { lease: 5, wait: 0, signal: controller.signal });
    const sent = await fake.waitLine((l) => l.startsWith("A c1 "));
    await waitFor(() => fake.model.keys.get("c1")!.queue.length === 1, 2000, "queued");
    const abortedAt = performance.now();
    controller.abort();
    const error = await pending.then(() => null, (e: unknown) => e);
    assert.ok(error instanceof CancelledError, String(error));
    assert.equal(error.code, "cancelled");
    const c = await fake.waitLine((l) => l === "C c1", 1000);
    assert.ok(c.at - abortedAt < 200, "C sent at once");
    assert.equal(c.conn, sent.conn, "on the acquire's connection");
    await error.settled;
    assert.equal(fake.model.keys.get("c1")!.queue.length, 0, "withdrawn from the queue");
    assert.equal(fake.linesMatching(/^R c1/).length, 0);
  });

  test("a grant that crossed the withdrawal is released at once", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    fake.hook = (c, line) => {
      if (line.startsWith("A x1 ")) return true; // queued, say
      if (line === "C x1") {
        c.send("A x1 777"); // granted just before the withdrawal arrived
        c.send("C x1 NONE");
        return true;
      }
      return false;
    };
    const controller = new AbortController();
    const pending = client.acquire("x1", { lease: 5, signal: controller.signal });
    await fake.waitLine((l) => l.startsWith("A x1 "));
    controller.abort();
    const error = (await pending.catch((e: unknown) => e)) as CancelledError;
    assert.equal(error.code, "cancelled");
    await error.settled;
    assert.deepEqual(wire(fake, /^(C|R) x1/), ["C x1", "R x1 777"]);
  });

  test("an acquire cancelled while waiting its turn is never sent", async (t) => {
    const { fake, client } = await fakeAndClient(t, { single: true });
    fake.hook = (_c, line) => line.startsWith("A turn ");
    const first = client.acquire("turn", { lease: 5 });
    const a = await fake.waitLine((l) => l.startsWith("A turn "));
    const controller = new AbortController();
    const second = client.acquire("turn", { lease: 5, signal: controller.signal });
    await sleep(100);
    controller.abort();
    await assert.rejects(second, CancelledError);
    a.conn.send("A turn 5");
    await (await first).release().catch(() => {});
    await sleep(200);
    assert.equal(wire(fake, /^A turn /).length, 1);
    assert.equal(wire(fake, /^C turn/).length, 0);
  });

  test("an already aborted signal sends nothing", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const before = fake.received.length;
    await assert.rejects(client.acquire("k", { lease: 5, signal: AbortSignal.abort() }), CancelledError);
    assert.equal(fake.received.length, before);
  });
});

describe("release and renew", { concurrency: true }, () => {
  test("release is retried every 200 ms across M * answers until answered", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("rel", { lease: 5 });
    let refused = 0;
    fake.hook = (c, line) => {
      if (line.startsWith("R rel ") && refused < 3) {
        refused++;
        c.send("M R rel *");
        return true;
      }
      return false;
    };
    await lock.release();
    const times = fake.linesMatching(/^R rel /).map((r) => r.at);
    assert.equal(times.length, 4);
    for (let i = 1; i < times.length; i++) {
      const gap = times[i]! - times[i - 1]!;
      assert.ok(gap > 120 && gap < 450, `gap ${gap} ms`);
    }
    assert.ok(Math.abs(times[3]! - times[0]! - 600) < 250, `the fourth at ${times[3]! - times[0]!} ms`);
  });

  test("release moves to another connection when one drops", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("reldrop", { lease: 5 });
    let dropped = false;
    fake.hook = (c, line) => {
      if (line.startsWith("R reldrop ") && !dropped) {
        dropped = true;
        c.destroy();
        return true;
      }
      return false;
    };
    const started = performance.now();
    await lock.release();
    const copies = fake.linesMatching(/^R reldrop /);
    assert.equal(copies.length, 2);
    assert.notEqual(copies[0]!.conn, copies[1]!.conn);
    assert.ok(performance.now() - started < 1000);
  });

  test("an unanswered release ends no_connection after 5 s", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("relstall", { lease: 30 });
    fake.hook = (_c, line) => line.startsWith("R relstall ");
    const started = performance.now();
    await assert.rejects(lock.release(), NoConnectionError);
    const took = performance.now() - started;
    assert.ok(took >= 4900 && took < 6000, `took ${took} ms`);
    // One copy per connection: each was busy with its copy.
    assert.equal(fake.linesMatching(/^R relstall /).length, 2);
  });

  test("STALE: the release rejects with StaleError", async (t) => {
    const { client } = await fakeAndClient(t);
    await assert.rejects(client.release("never", "12"), (e: unknown) => e instanceof StaleError && e.code === "stale");
  });

  test("renew sends N key token lease and extends the lock", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("ren", { lease: 1 });
    await lock.renew(2.5);
    assert.deepEqual(wire(fake, /^N ren/), [`N ren ${lock.token} 2.5`]);
    assert.ok(lock.validFor > 2);
    await lock.release();
    await assert.rejects(lock.renew(), StaleError);
  });

  test("an unanswered renew ends no_connection by the time the lease runs out", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("renstall", { lease: 1.5 });
    fake.hook = (_c, line) => line.startsWith("N renstall ");
    const started = performance.now();
    await assert.rejects(lock.renew(), NoConnectionError);
    assert.ok(performance.now() - started < 1700);
  });
});

describe("keep-alive", { concurrency: true }, () => {
  test("renews every third of the lease", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("ka", { lease: 0.9, keepalive: true });
    let lost = false;
    lock.on("lost", () => (lost = true));
    await sleep(1500);
    const times = fake.linesMatching(/^N ka /).map((r) => r.at);
    assert.ok(times.length >= 3 && times.length <= 6, `${times.length} renewals`);
    for (let i = 1; i < times.length; i++) assert.ok(times[i]! - times[i - 1]! > 200, "a third of the lease apart");
    assert.equal(lost, false);
    await lock.release();
  });

  test("a refused renewal (STALE) is a lost event, once, and aborts lock.signal", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("kst", { lease: 3, keepalive: true });
    let staleAt = 0;
    fake.hook = (c, line) => {
      if (line.startsWith("N kst ")) {
        staleAt = performance.now();
        c.send("N kst STALE");
        return true;
      }
      return false;
    };
    const events: LockLostError[] = [];
    let lostAt = 0;
    lock.on("lost", (e) => {
      lostAt = performance.now();
      events.push(e);
    });
    await waitFor(() => events.length > 0, 2500, "lost (the renewal is due after a second)");
    assert.ok(lostAt - staleAt < 300, `told ${lostAt - staleAt} ms after the STALE answer, not when the lease ran out`);
    assert.match(events[0]!.reason, /refused/);
    await sleep(400);
    assert.equal(events.length, 1);
    assert.equal(events[0]!.key, "kst");
    assert.equal(events[0]!.token, lock.token);
    assert.ok(lock.signal.aborted && lock.signal.reason === events[0]);
    assert.equal(fake.linesMatching(/^N kst /).length, 1, "no renewal after the loss");
  });

  test("renewals that get no answer: lost when the lease runs out", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const lock = await client.acquire("knone", { lease: 0.9, keepalive: true });
    fake.hook = (_c, line) => line.startsWith("N knone ");
    const started = performance.now();
    const error = await new Promise<LockLostError>((resolve) => lock.once("lost", resolve));
    const took = performance.now() - started;
    assert.ok(took < 1300, `lost after ${took} ms`);
    assert.match(error.reason, /lease ran out/);
  });

  test("a lock without keep-alive tells lost when its lease runs out", async (t) => {
    const { client } = await fakeAndClient(t);
    const lock = await client.acquire("plain", { lease: 0.3 });
    const error = await new Promise<LockLostError>((resolve) => lock.once("lost", resolve));
    assert.match(error.reason, /no renewal/);
  });
});

describe("redirects", { concurrency: true }, () => {
  test("M op key host:port: the client switches to the named active", async (t) => {
    const active = await FakeServer.start();
    const standby = await FakeServer.start({ redirect: active.address });
    const client = connect(standby.address, { name: "t" });
    t.after(async () => {
      await client.close();
      await standby.close();
      await active.close();
    });
    const lock = await client.acquire("red", { lease: 5, wait: 2 });
    assert.deepEqual(wire(standby, /^A red/), ["A red 5 2"]);
    assert.equal(wire(active, /^A red/).length, 1);
    assert.match(active.received[0]!.line, INSTANCE, "named on the new connection first");
    await lock.release();
    assert.equal(wire(active, /^R red/).length, 1);
    await lock.release();
    const holder = await client.holder("red");
    assert.equal(holder.token, "0");
  });

  test("M op key *: retried until the wait runs out, then no_connection", async (t) => {
    const standby = await FakeServer.start({ redirect: "*" });
    const client = connect(standby.address);
    t.after(async () => {
      await client.close();
      await standby.close();
    });
    const started = performance.now();
    await assert.rejects(client.acquire("none", { lease: 5, wait: 1 }), NoConnectionError);
    const took = performance.now() - started;
    assert.ok(took >= 950 && took < 2500, `took ${took} ms`);
    assert.ok(wire(standby, /^A none/).length >= 3, "retried");
  });

  test("M op key * then an active: the acquire goes on", async (t) => {
    const active = await FakeServer.start();
    const standby = await FakeServer.start({ redirect: "*" });
    const client = connect(standby.address);
    t.after(async () => {
      await client.close();
      await standby.close();
      await active.close();
    });
    const pending = client.acquire("later", { lease: 5, wait: 5 });
    await standby.waitLine((l) => l.startsWith("A later"));
    standby.redirect = active.address;
    const lock = await pending;
    assert.equal(wire(active, /^A later/).length, 1);
    await lock.release();
  });
});

describe("observe and elections", { concurrency: true }, () => {
  test("observe yields the holder now, then each change", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const controller = new AbortController();
    const seen: Array<{ token: string; holder: string | null; value: string | null }> = [];
    const watching = (async () => {
      for await (const state of client.observe("w", { signal: controller.signal })) {
        seen.push({ token: state.token, holder: state.holder, value: state.value });
      }
    })();
    await waitFor(() => seen.length === 1, 3000, "the first state");
    assert.deepEqual(seen[0], { token: "0", holder: null, value: null });
    const token = fake.model.grantTo("w", "web-1#0123456789ab");
    await waitFor(() => seen.length === 2, 3000, "the grant");
    assert.deepEqual(seen[1], { token: token.toString(), holder: "web-1#0123456789ab", value: "web-1" });
    fake.model.releaseToken("w", token);
    await waitFor(() => seen.length === 3, 3000, "the release");
    assert.equal(seen[2]!.token, "0");
    const lines = wire(fake, /^O w /);
    assert.equal(lines[0], "O w ? 0");
    assert.equal(lines[1], "O w 0 10");
    assert.equal(lines[2], `O w ${token} 10`);
    controller.abort();
    await assert.rejects(watching, CancelledError);
  });

  test("observeOnce: the token sent, unchanged until the wait runs out", async (t) => {
    const { client } = await fakeAndClient(t);
    const started = performance.now();
    const result = await client.observeOnce("quiet", "0", 0.3);
    assert.equal(result.changed, false);
    assert.equal(result.token, "0");
    assert.ok(performance.now() - started >= 280);
  });

  test("campaign: the election's key, wait 0, keep-alive, on a connection named value#instance", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const leadership = await client.campaign("elect", "10.0.0.7:80", { lease: 3 });
    const a = fake.linesMatching(/^A elect /);
    assert.equal(a.length, 1);
    assert.equal(a[0]!.line, "A elect 3 0");
    assert.equal(a[0]!.conn.name, `10.0.0.7:80#${client.instance}`);
    const leader = await client.leader("elect");
    assert.equal(leader.value, "10.0.0.7:80");
    assert.equal(leader.token, leadership.token);
    await assert.rejects(client.campaign("elect", "bad value"), InvalidError);
    await assert.rejects(client.campaign("elect", ""), InvalidError);
    await assert.rejects(client.campaign("elect", "x".repeat(238)), InvalidError);
    await leadership.resign();
    assert.deepEqual(wire(fake, /^R elect/), [`R elect ${leadership.token}`]);
    const nobody = await client.leader("elect");
    assert.equal(nobody.value, null);
    assert.equal(nobody.token, "0");
    await waitFor(() => fake.live.every((c: FakeConn) => c.name === null || !c.name.startsWith("10.0.0.7:80#")), 3000, "the campaign's connections closed");
  });

  test("a cancelled campaign whose grant crossed the withdrawal: its connection stays open until the grant is released", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    let answer: (() => void) | null = null;
    fake.hook = (c, line) => {
      if (line.startsWith("A crossed ")) return true; // granted, its answer on its way
      if (line === "C crossed") {
        // The grant and then the withdrawal's answer arrive a moment later.
        answer = () => {
          c.send("A crossed 4243");
          c.send("C crossed NONE");
        };
        return true;
      }
      return false;
    };
    const controller = new AbortController();
    const pending = client.campaign("crossed", "cand", { signal: controller.signal });
    const sent = await fake.waitLine((l) => l.startsWith("A crossed "));
    controller.abort();
    const error = (await pending.catch((e: unknown) => e)) as CancelledError;
    assert.ok(error instanceof CancelledError, String(error));
    await fake.waitLine((l) => l === "C crossed");
    await sleep(300);
    assert.equal(sent.conn.closed, false, "the candidacy's connection waits for the answers");
    answer!();
    await error.settled;
    assert.deepEqual(wire(fake, /^(C|R) crossed/), ["C crossed", "R crossed 4243"]);
    await waitFor(() => sent.conn.closed, 5000, "the candidacy's connection closed once settled");
  });

  test("a second candidate waits; aborting its campaign withdraws it", async (t) => {
    const { fake, client } = await fakeAndClient(t);
    const first = await client.campaign("e2", "a");
    const controller = new AbortController();
    const second = client.campaign("e2", "b", { signal: controller.signal });
    await waitFor(() => (fake.model.keys.get("e2")?.queue.length ?? 0) === 1, 3000, "queued");
    controller.abort();
    await assert.rejects(second, CancelledError);
    await waitFor(() => fake.model.keys.get("e2")!.queue.length === 0, 3000, "withdrawn");
    assert.equal(wire(fake, /^C e2/).length, 1);
    await first.resign();
  });
});
