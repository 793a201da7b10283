/**
 * The README's examples: each is a file under examples/, included in the
 * README verbatim (checked here), compiled, and run against the fake node
 * (and, in realnode.test, against a real node).
 */

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";

import { EXPECT, runExample } from "./examples-lib.js";
import { FakeServer } from "./fake.js";
import { ROOT, makeCerts, type Certs } from "./helpers.js";

test("every example is in the README verbatim, and every example is tested", () => {
  const readme = fs.readFileSync(path.join(ROOT, "README.md"), "utf8");
  const files = fs.readdirSync(path.join(ROOT, "examples")).filter((f) => f.endsWith(".ts"));
  assert.deepEqual(files.map((f) => f.replace(/\.ts$/, "")).sort(), Object.keys(EXPECT).sort());
  for (const file of files) {
    const code = fs.readFileSync(path.join(ROOT, "examples", file), "utf8");
    assert.ok(readme.includes("```ts\n" + code + "```\n"), `README.md includes examples/${file} verbatim in a ts block`);
  }
});

describe("the examples run against the fake node", { concurrency: true }, () => {
  let certs: Certs;
  let tlsFake: FakeServer;

  before(async () => {
    certs = makeCerts();
    tlsFake = await FakeServer.start({
      tls: {
        cert: fs.readFileSync(certs.nodeCert),
        key: fs.readFileSync(certs.nodeKey),
        ca: fs.readFileSync(certs.ca),
        requestCert: true,
        rejectUnauthorized: true,
      },
    });
  });

  after(async () => {
    await tlsFake.close();
    fs.rmSync(certs.dir, { recursive: true, force: true });
  });

  for (const [name, patterns] of Object.entries(EXPECT)) {
    test(name, async (t) => {
      // A fake of its own: examples running at once use the same keys.
      const own = name === "tls" ? null : await FakeServer.start();
      if (own !== null) t.after(() => own.close());
      const env: Record<string, string> =
        own === null
          ? { LOCKSERVICE_ADDR: tlsFake.address, LOCKSERVICE_CA: certs.ca, LOCKSERVICE_CERT: certs.clientCert, LOCKSERVICE_KEY: certs.clientKey }
          : { LOCKSERVICE_ADDR: own.address };
      const result = await runExample(name, env);
      assert.equal(result.code, 0, `exit ${result.code}: ${result.stderr}`);
      for (const p of patterns) assert.match(result.stdout, p);
    });
  }
});
