/**
 * The conformance driver against the fake node.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, test, type TestContext } from "node:test";

import { FakeServer, waitFor } from "./fake.js";
import { DRIVER, DriverProcess, freePort, sleep } from "./helpers.js";

async function driverAndFake(t: TestContext, extra: string[] = []): Promise<{ fake: FakeServer; driver: DriverProcess }> {
  const fake = await FakeServer.start();
  const driver = new DriverProcess(["--addrs", fake.address, "--name", "drv", ...extra]);
  t.after(async () => {
    await driver.kill();
    await fake.close();
  });
  return { fake, driver };
}

describe("driver arguments", { concurrency: true }, () => {
  const cases: Array<[string, string[]]> = [
    ["no arguments", []],
    ["--addrs without a value", ["--addrs"]],
    ["an unknown option", ["--addrs", "127.0.0.1:1", "--bogus", "x"]],
    ["a positional argument", ["--addrs", "127.0.0.1:1", "extra"]],
    ["an address without a port", ["--addrs", "nohost"]],
    ["a port out of range", ["--addrs", "127.0.0.1:70000"]],
    ["a bad name", ["--addrs", "127.0.0.1:1", "--name", "a b"]],
    ["a certificate without its key", ["--addrs", "127.0.0.1:1", "--tls-ca", DRIVER, "--tls-cert", DRIVER]],
    ["a client certificate without a CA", ["--addrs", "127.0.0.1:1", "--tls-cert", DRIVER, "--tls-key", DRIVER]],
    ["an unreadable CA file", ["--addrs", "127.0.0.1:1", "--tls-ca", "/nonexistent/ca.pem"]],
  ];
  for (const [what, args] of cases) {
    test(`${what}: one line on stderr, nothing on stdout, exit 2`, () => {
      const run = spawnSync(process.execPath, [DRIVER, ...args], { input: "", encoding: "utf8", timeout: 10_000 });
      assert.equal(run.status, 2, `exit ${run.status}; stderr ${run.stderr}`);
      assert.equal(run.stdout, "");
      assert.match(run.stderr, /^[^\n]+\n$/, `one line: ${JSON.stringify(run.stderr)}`);
    });
  }
});

describe("driver commands", { concurrency: true }, () => {
  test("acquire, renew, release: tokens as strings, ids echoed as given", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "k", lease: 30, wait: 5, share: null, keepalive: false });
    const granted = await driver.result(1);
    assert.equal(granted["ok"], true);
    assert.equal(typeof granted["token"], "string");
    assert.match(granted["token"] as string, /^[0-9]+$/);
    driver.send({ id: "two", op: "renew", key: "k", token: granted["token"], lease: 12.5 });
    assert.deepEqual(await driver.result("two"), { id: "two", ok: true });
    driver.send({ id: 3, op: "release", key: "k", token: granted["token"] });
    assert.deepEqual(await driver.result(3), { id: 3, ok: true });
    driver.send({ id: 4, op: "release", key: "k", token: granted["token"] });
    assert.equal((await driver.result(4))["error"], "stale");
    driver.send({ id: 5, op: "renew", key: "k", token: granted["token"], lease: 1 });
    assert.equal((await driver.result(5))["error"], "stale");
    assert.deepEqual(
      fake.linesMatching(/^[ARN] k /).map((r) => r.line),
      ["A k 30 5", `N k ${granted["token"]} 12.5`, `R k ${granted["token"]}`, `R k ${granted["token"]}`, `N k ${granted["token"]} 1`],
    );
    assert.match(fake.received[0]!.line, /^I drv#[0-9a-f]{12}$/);
  });

  test("ids beyond 2^53 (and cancel targets) are echoed exactly as given", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    fake.model.grantTo("big", "other#1");
    driver.send('{"id":9007199254740993,"op":"acquire","key":"big","lease":30,"wait":0}');
    await fake.waitLine((l) => l.startsWith("A big "));
    // 9007199254740992 is the same float64: it must not find the acquire.
    driver.send('{"id":1,"op":"cancel","target":9007199254740992}');
    driver.send('{"id":12345678901234567890123,"op":"cancel","target":9007199254740993}');
    await driver.next((o) => o["id"] === 1);
    await driver.next((o) => o["ok"] === true && typeof o["id"] === "number" && o["id"] > 1e22);
    const raw = (id: string): string | undefined => driver.raw.find((line) => line.startsWith(`{"id":${id},`));
    assert.match(raw("1") ?? "", /"error":"unknown_target"/);
    assert.match(raw("9007199254740993") ?? "", /"error":"cancelled"/);
    assert.equal(raw("12345678901234567890123"), '{"id":12345678901234567890123,"ok":true}');
    assert.equal(raw("9007199254740992"), undefined);
    driver.send('{"id":-7,"op":"nope"}');
    driver.send('{"id":2.5,"op":"nope"}');
    await driver.next((o) => o["id"] === -7);
    await driver.next((o) => o["id"] === null);
  });

  test("commands run concurrently: results in completion order", async (t) => {
    const { driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "c", lease: 30, wait: 5 });
    const first = await driver.result(1);
    driver.send({ id: 2, op: "acquire", key: "c", lease: 30, wait: 5 });
    driver.send({ id: 3, op: "acquire", key: "d", lease: 30, wait: 5 });
    await driver.result(3);
    assert.equal(driver.indexOf(2), -1, "2 still waits");
    driver.send({ id: 4, op: "release", key: "c", token: first["token"] });
    const second = await driver.result(2);
    assert.equal(second["ok"], true);
    assert.ok(BigInt(second["token"] as string) > BigInt(first["token"] as string));
  });

  test("errors: timeout, rejected, stale, invalid, bad_command", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "e", lease: 30, wait: 5, share: 3 });
    await driver.result(1);
    driver.send({ id: 2, op: "acquire", key: "e", lease: 30, wait: 0.2 });
    assert.equal((await driver.result(2))["error"], "rejected");
    driver.send({ id: 3, op: "acquire", key: "x", lease: 30, wait: 1 });
    await driver.result(3);
    driver.send({ id: 4, op: "acquire", key: "x", lease: 30, wait: 0.2 });
    assert.equal((await driver.result(4))["error"], "timeout");
    driver.send({ id: 5, op: "release", key: "x", token: "12345" });
    assert.equal((await driver.result(5))["error"], "stale");
    const before = fake.received.length;
    const invalid: Array<Record<string, unknown>> = [
      { id: 10, op: "acquire", key: "a b", lease: 30, wait: 1 },
      { id: 11, op: "acquire", key: "k", lease: 0, wait: 1 },
      { id: 12, op: "acquire", key: "k", lease: -1, wait: 1 },
      { id: 13, op: "acquire", key: "k", lease: 1, wait: -1 },
      { id: 14, op: "acquire", key: "k", lease: 1, wait: 1, share: "w" },
      { id: 15, op: "acquire", key: "k", lease: 1, wait: 1, share: 0 },
      { id: 16, op: "acquire", key: "k", lease: 1, wait: 1, share: 65536 },
      { id: 17, op: "release", key: "k", token: "12a" },
      { id: 18, op: "release", key: "k", token: "18446744073709551616" },
      { id: 19, op: "renew", key: "k", token: "1", lease: 0 },
      { id: 20, op: "acquire", key: "", lease: 1, wait: 1 },
      { id: 21, op: "acquire", key: "x".repeat(251), lease: 1, wait: 1 },
      { id: 22, op: "observe", key: "k k", token: "0", wait: 1 },
      { id: 23, op: "campaign", election: "e", value: "a b", lease: 5 },
      { id: 24, op: "acquire", key: "k", lease: 1, wait: 1, share: 2.5 },
    ];
    for (const c of invalid) driver.send(c);
    for (const c of invalid) assert.equal((await driver.result(c["id"]))["error"], "invalid", JSON.stringify(c));
    const bad: Array<[string, unknown]> = [
      ["not json", null],
      ['{"id":30,"op":"nope"}', 30],
      ['{"id":31,"op":"acquire","key":"k","lease":1}', 31],
      ['{"id":32,"op":"acquire","key":5,"lease":1,"wait":1}', 32],
      ['{"op":"acquire","key":"k","lease":1,"wait":1}', null],
      ['{"id":33,"op":"release","key":"k","token":5}', 33],
      ['{"id":34,"op":"observe","key":"k","token":"0"}', 34],
      ['{"id":35,"op":"cancel"}', 35],
      ['{"id":36,"op":"acquire","key":"k","lease":"1","wait":1}', 36],
      ['{"id":37,"op":"acquire","key":"k","lease":1,"wait":1,"keepalive":"yes"}', 37],
      ["[1,2]", null],
      ['{"id":38}', 38],
    ];
    for (const [line] of bad) driver.send(line);
    await waitFor(() => driver.out.filter((o) => o["error"] === "bad_command").length === bad.length, 5000, "bad_command answers");
    const answers = driver.out.filter((o) => o["error"] === "bad_command").map((o) => o["id"]);
    assert.deepEqual(answers, bad.map(([, id]) => id));
    await sleep(100);
    assert.equal(fake.received.length, before, "nothing refused reached the node");
    driver.send({ id: 39, op: "acquire", key: "nulls", lease: 1, wait: 1, share: null, keepalive: null });
    assert.equal((await driver.result(39))["ok"], true, "null optional fields are omitted ones");
    driver.send({ id: 40, op: "acquire", key: "alive", lease: 1, wait: 1 });
    assert.equal((await driver.result(40))["ok"], true, "the driver goes on");
  });

  test("lease and wait on the wire: seconds grammar, microseconds, never 0 for a positive value", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "f1", lease: 1e-7, wait: 2.0 });
    driver.send({ id: 2, op: "acquire", key: "f2", lease: 1.5e3, wait: 1e-9 });
    driver.send({ id: 3, op: "acquire", key: "f3", lease: 0.1234567, wait: 0 });
    await Promise.all([driver.result(1), driver.result(2), driver.result(3)]);
    const lines = fake.linesMatching(/^A f/).map((r) => r.line).sort();
    assert.deepEqual(lines, ["A f1 0.000001 2", "A f2 1500 0.000001", "A f3 0.123457 0"]);
  });

  test("cancel: C on the wire, the target's cancelled result before the cancel's ok", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    fake.model.grantTo("q", "other#1");
    driver.send({ id: 1, op: "acquire", key: "q", lease: 30, wait: 0 });
    await waitFor(() => fake.model.keys.get("q")!.queue.length === 1, 5000, "queued");
    driver.send({ id: 2, op: "cancel", target: 1 });
    const ok = await driver.result(2);
    assert.deepEqual(ok, { id: 2, ok: true });
    const target = driver.out[driver.indexOf(1)]!;
    assert.equal(target["error"], "cancelled");
    assert.ok(driver.indexOf(1) < driver.indexOf(2), "the target's result first");
    assert.equal(fake.linesMatching(/^C q$/).length, 1);
    assert.equal(fake.model.keys.get("q")!.queue.length, 0);
    driver.send({ id: 3, op: "cancel", target: 1 });
    assert.equal((await driver.result(3))["error"], "unknown_target");
    driver.send({ id: 4, op: "cancel", target: 99 });
    assert.equal((await driver.result(4))["error"], "unknown_target");
    driver.send({ id: "s", op: "acquire", key: "free", lease: 30, wait: 0 });
    await driver.result("s");
    driver.send({ id: 5, op: "cancel", target: "s" });
    assert.equal((await driver.result(5))["error"], "unknown_target", "a finished target");
  });

  test("cancel: a grant that crossed the withdrawal is released before the cancel's ok", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    fake.hook = (c, line) => {
      if (line.startsWith("A cross ")) return true;
      if (line === "C cross") {
        c.send("A cross 4242");
        c.send("C cross NONE");
        return true;
      }
      return false;
    };
    driver.send({ id: 1, op: "acquire", key: "cross", lease: 30, wait: 0 });
    await fake.waitLine((l) => l.startsWith("A cross "));
    driver.send({ id: 2, op: "cancel", target: 1 });
    await driver.result(2);
    assert.ok(driver.indexOf(1) < driver.indexOf(2));
    assert.deepEqual(fake.linesMatching(/^(C|R) cross/).map((r) => r.line), ["C cross", "R cross 4242"]);
  });

  test("observe: a change, a timeout repeating the token, a cancel", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "observe", key: "o", token: "0", wait: 5 });
    await fake.waitLine((l) => l.startsWith("O o "));
    const token = fake.model.grantTo("o", "web#0123456789ab");
    assert.deepEqual(await driver.result(1), { id: 1, ok: true, token: token.toString(), holder: "web#0123456789ab", value: "web" });
    driver.send({ id: 2, op: "observe", key: "o", token: token.toString(), wait: 0.3 });
    const timeout = await driver.result(2);
    assert.equal(timeout["error"], "timeout");
    assert.equal(timeout["token"], token.toString());
    driver.send({ id: 3, op: "observe", key: "free", token: "5", wait: 5 });
    assert.deepEqual(await driver.result(3), { id: 3, ok: true, token: "0", holder: null, value: null });
    driver.send({ id: 4, op: "observe", key: "o", token: token.toString(), wait: 0 });
    await fake.waitLine((l) => l.startsWith(`O o ${token} `));
    driver.send({ id: 5, op: "cancel", target: 4 });
    await driver.result(5);
    assert.equal(driver.out[driver.indexOf(4)]!["error"], "cancelled");
    assert.ok(driver.indexOf(4) < driver.indexOf(5));
  });

  test("campaign, leader, resign", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "leader", election: "el" });
    assert.deepEqual(await driver.result(1), { id: 1, ok: true, value: null, token: "0", holder: null });
    driver.send({ id: 2, op: "campaign", election: "el", value: "node-a", lease: 10 });
    const won = await driver.result(2);
    assert.equal(won["ok"], true);
    const a = fake.linesMatching(/^A el /)[0]!;
    assert.equal(a.line, "A el 10 0");
    assert.match(a.conn.name!, /^node-a#[0-9a-f]{12}$/);
    driver.send({ id: 3, op: "leader", election: "el" });
    const leader = await driver.result(3);
    assert.equal(leader["value"], "node-a");
    assert.equal(leader["token"], won["token"]);
    driver.send({ id: 4, op: "campaign", election: "el", value: "node-b", lease: 10 });
    await waitFor(() => fake.model.keys.get("el")!.queue.length === 1, 5000, "the second candidate waits");
    driver.send({ id: 5, op: "resign", election: "el" });
    assert.deepEqual(await driver.result(5), { id: 5, ok: true });
    const second = await driver.result(4);
    assert.equal(second["ok"], true);
    driver.send({ id: 6, op: "leader", election: "el" });
    assert.equal((await driver.result(6))["value"], "node-b");
    for (const [id, value] of [[7, ""], [8, "has space"], [9, "x".repeat(238)], [10, "tab\there"]] as const) {
      driver.send({ id, op: "campaign", election: "el2", value, lease: 5 });
      assert.equal((await driver.result(id))["error"], "invalid", `value ${JSON.stringify(value)}`);
    }
  });

  test("lost events for kept-alive locks and leaderships only", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    fake.hook = (c, line) => {
      if (line.startsWith("N ")) {
        c.send(`N ${line.split(" ")[1]} STALE`);
        return true;
      }
      return false;
    };
    // Renewals are due a third of the lease in, refused at once; the lease itself would run out much later.
    driver.send({ id: 1, op: "acquire", key: "ka", lease: 3, wait: 1, keepalive: true });
    const granted = await driver.result(1);
    driver.send({ id: 2, op: "acquire", key: "plain", lease: 0.3, wait: 1 });
    await driver.result(2);
    const lost = await driver.next((o) => o["event"] === "lost", 2500);
    assert.deepEqual(lost, { event: "lost", key: "ka", token: granted["token"] });
    driver.send({ id: 3, op: "campaign", election: "lead", value: "v", lease: 3 });
    const won = await driver.result(3);
    const lostLead = await driver.next((o) => o["event"] === "lost" && o["key"] === "lead", 2500);
    assert.equal(lostLead["token"], won["token"]);
    await sleep(300);
    assert.equal(driver.out.filter((o) => o["event"] === "lost").length, 2, "nothing for the lock without keep-alive");
  });

  test("close: pending commands cancelled, held locks released, ok, exit 0", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "h", lease: 30, wait: 5 });
    const held = await driver.result(1);
    driver.send({ id: 2, op: "acquire", key: "h", lease: 30, wait: 0 });
    await waitFor(() => fake.model.keys.get("h")!.queue.length === 1, 5000, "queued");
    driver.send({ id: 3, op: "close" });
    assert.equal(await driver.exited, 0);
    assert.equal(driver.out[driver.indexOf(2)]!["error"], "cancelled");
    assert.deepEqual(driver.out[driver.out.length - 1], { id: 3, ok: true });
    assert.ok(fake.linesMatching(new RegExp(`^R h ${held["token"]}$`)).length >= 1, "released");
    assert.equal(fake.model.keys.has("h"), false);
  });

  test("end of stdin: like close without the ok line", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "eof", lease: 30, wait: 5 });
    const held = await driver.result(1);
    driver.send({ id: 2, op: "observe", key: "eof", token: held["token"], wait: 0 });
    await fake.waitLine((l) => l.startsWith("O eof "));
    driver.endInput();
    assert.equal(await driver.exited, 0);
    assert.equal(driver.out[driver.indexOf(2)]!["error"], "cancelled");
    assert.equal(driver.out.length, 2);
    assert.equal(fake.linesMatching(new RegExp(`^R eof ${held["token"]}$`)).length, 1);
  });

  test("a node that never answers holds no command forever", async (t) => {
    const { fake, driver } = await driverAndFake(t);
    driver.send({ id: 1, op: "acquire", key: "held", lease: 2, wait: 2 });
    const held = await driver.result(1);
    await waitFor(() => fake.live.length === 2, 5000, "both connections");
    fake.silent = true;
    const started = performance.now();
    driver.send({ id: 2, op: "acquire", key: "s", lease: 5, wait: 1 });
    driver.send({ id: 3, op: "renew", key: "held", token: held["token"], lease: 5 });
    driver.send({ id: 4, op: "release", key: "s2", token: "77" });
    const acquired = await driver.result(2);
    assert.ok(["timeout", "no_connection"].includes(acquired["error"] as string), JSON.stringify(acquired));
    assert.ok(performance.now() - started < 4000, "the acquire ends at most 3 s after its wait");
    assert.equal((await driver.result(3))["error"], "no_connection");
    assert.ok(performance.now() - started < 4000, "the renew ends by the time the lease runs out");
    assert.equal((await driver.result(4))["error"], "no_connection");
    const took = performance.now() - started;
    assert.ok(took > 4500 && took < 7000, `the release ends after its 5 s of retries (${took} ms)`);
  });

  test("no usable connection: no_connection, quickly", async (t) => {
    const driver = new DriverProcess(["--addrs", `127.0.0.1:${await freePort()}`]);
    t.after(() => driver.kill());
    const started = performance.now();
    driver.send({ id: 1, op: "acquire", key: "k", lease: 5, wait: 0 });
    driver.send({ id: 2, op: "leader", election: "k" });
    driver.send({ id: 3, op: "release", key: "k", token: "5" });
    assert.equal((await driver.result(1))["error"], "no_connection");
    assert.equal((await driver.result(2))["error"], "no_connection");
    assert.ok(performance.now() - started < 10_000);
    assert.equal((await driver.result(3))["error"], "no_connection");
  });
});
