import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";

import { VERSION } from "../dist/index.js";
import { ROOT } from "./helpers.js";
import { rawMembers } from "../dist/rawjson.js";
import { MAX_TIMER_MS, later } from "../dist/timer.js";
import { checkToken, formatSeconds, keyProblem, pairOf, parseAddress, shareField, valueOfName } from "../dist/wire.js";

test("VERSION is 0.2.0, as in package.json", async () => {
  assert.equal(VERSION, "0.2.0");
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")) as { version: string };
  assert.equal(pkg.version, VERSION);
});

test("seconds are written in the wire grammar, to the microsecond, never with an exponent", () => {
  const cases: Array<[number, string]> = [
    [30, "30"],
    [0, "0"],
    [0.5, "0.5"],
    [1.25, "1.25"],
    [0.000001, "0.000001"],
    [1e-7, "0.000001"],
    [4e-7, "0.000001"],
    [1e-20, "0.000001"],
    [0.0000015, "0.000002"],
    [86400, "86400"],
    [86400.0000001, "86400"],
    [1e21, "1000000000000000000000"],
    [1.5e22, "15000000000000000000000"],
    [123456.7890123, "123456.789012"],
  ];
  for (const [value, text] of cases) {
    assert.equal(formatSeconds(value), text, `formatSeconds(${value})`);
    assert.match(formatSeconds(value), /^[0-9]+(\.[0-9]+)?$/);
  }
  assert.throws(() => formatSeconds(-1), { code: "invalid" });
  assert.throws(() => formatSeconds(Number.NaN), { code: "invalid" });
  assert.throws(() => formatSeconds(Infinity), { code: "invalid" });
});

test("keys: 1-250 bytes of UTF-8, no space, no control character", () => {
  assert.equal(keyProblem("orders/42"), null);
  assert.equal(keyProblem("ключ"), null);
  assert.equal(keyProblem("🔒"), null);
  assert.equal(keyProblem("x".repeat(250)), null);
  assert.equal(keyProblem("é".repeat(125)), null);
  assert.notEqual(keyProblem("é".repeat(126)), null);
  assert.notEqual(keyProblem("x".repeat(251)), null);
  assert.notEqual(keyProblem(""), null);
  assert.notEqual(keyProblem("a b"), null);
  assert.notEqual(keyProblem("a\tb"), null);
  assert.notEqual(keyProblem("a\u0085b"), null);
  assert.notEqual(keyProblem("a\u007fb"), null);
  assert.notEqual(keyProblem("a\ud800b"), null);
  assert.notEqual(keyProblem(42), null);
});

test("tokens are decimal strings up to 2^64-1, canonical", () => {
  assert.equal(checkToken("18446744073709551615"), "18446744073709551615");
  assert.equal(checkToken("007"), "7");
  assert.equal(checkToken(5n), "5");
  assert.throws(() => checkToken("18446744073709551616"), { code: "invalid" });
  assert.throws(() => checkToken("-1"), { code: "invalid" });
  assert.throws(() => checkToken("1e3"), { code: "invalid" });
  assert.throws(() => checkToken(""), { code: "invalid" });
  assert.throws(() => checkToken(12 as unknown as string), { code: "invalid" });
});

test("shares: exclusive, read, or a semaphore of 2..65535", () => {
  assert.equal(shareField(undefined), "");
  assert.equal(shareField(null), "");
  assert.equal(shareField(1), "");
  assert.equal(shareField("r"), "r");
  assert.equal(shareField(2), "2");
  assert.equal(shareField(65535), "65535");
  for (const bad of [0, 65536, 2.5, "w", "2", -3, true, {}]) {
    assert.throws(() => shareField(bad), { code: "invalid" }, `share ${JSON.stringify(bad)}`);
  }
});

test("answers pair with their requests by (op, key)", () => {
  assert.equal(pairOf(["A", "k", "123"]), "A k");
  assert.equal(pairOf(["T", "k"]), "A k");
  assert.equal(pairOf(["R", "k", "OK"]), "R k");
  assert.equal(pairOf(["N", "k", "STALE"]), "N k");
  assert.equal(pairOf(["C", "k", "NONE"]), "C k");
  assert.equal(pairOf(["O", "k", "0", "-"]), "O k");
  assert.equal(pairOf(["M", "A", "k", "h:1"]), "A k");
  assert.equal(pairOf(["E", "O", "k", "too", "many"]), "O k");
  assert.equal(pairOf(["Z"]), null);
});

test("addresses and names", () => {
  assert.deepEqual(parseAddress("127.0.0.1:7700"), { host: "127.0.0.1", port: 7700, text: "127.0.0.1:7700" });
  assert.deepEqual(parseAddress("[::1]:7700"), { host: "::1", port: 7700, text: "[::1]:7700" });
  assert.throws(() => parseAddress("nohost"), { code: "invalid" });
  assert.throws(() => parseAddress("h:0"), { code: "invalid" });
  assert.throws(() => parseAddress("h:99999"), { code: "invalid" });
  assert.throws(() => parseAddress("::1:80"), { code: "invalid" });
  assert.equal(valueOfName("web-1#0123456789ab"), "web-1");
  assert.equal(valueOfName("a#b#0123456789ab"), "a#b");
  assert.equal(valueOfName("plain"), "plain");
});

test("timers hold delays beyond 2^31-1 ms (24.8 days) and fire short ones on time", async () => {
  const fired: string[] = [];
  const long = later(() => fired.push("long"), MAX_TIMER_MS + 1000);
  const days29 = later(() => fired.push("29 days"), 29 * 86400 * 1000);
  const huge = later(() => fired.push("1e24 ms"), 1e24);
  const never = later(() => fired.push("never"), Infinity);
  const cleared = later(() => fired.push("cleared"), 10);
  cleared.clear();
  later(() => fired.push("short"), 20);
  await new Promise((resolve) => setTimeout(resolve, 200));
  assert.deepEqual(fired, ["short"]);
  for (const timer of [long, days29, huge, never]) timer.clear();
});

test("the raw text of each member of a JSON object (ids beyond 2^53 kept exactly)", () => {
  const text = '{ "id" : 9007199254740993 , "op":"x","n":{"id":1,"a":[1,{"b":"}"}]},"s":"a\\"b","\\u0069d2":-1.5e3, "t":true}';
  const members = rawMembers(text)!;
  assert.equal(members.get("id"), "9007199254740993");
  assert.equal(members.get("op"), '"x"');
  assert.equal(members.get("n"), '{"id":1,"a":[1,{"b":"}"}]}');
  assert.equal(members.get("s"), '"a\\"b"');
  assert.equal(members.get("id2"), "-1.5e3");
  assert.equal(members.get("t"), "true");
  assert.equal(rawMembers('{"id":1,"id":2}')!.get("id"), "2", "the last of duplicates, as JSON.parse");
  assert.equal(rawMembers("[1]"), null);
  assert.deepEqual([...rawMembers("{}")!], []);
});
