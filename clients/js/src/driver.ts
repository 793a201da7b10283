#!/usr/bin/env node
/**
 * The conformance driver ("Conformance driver" in docs/protocol.md):
 *
 *     node dist/driver.js --addrs HOST:PORT[,HOST:PORT...] [--name NAME]
 *                         [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]
 *
 * JSON lines: one command per line on stdin, one result or event per line
 * on stdout. Commands run concurrently; results come in completion order,
 * each echoing its command's `id`. Logs go to stderr.
 */

import * as fs from "node:fs";
import * as readline from "node:readline";
import type * as tls from "node:tls";

import { Client, connect } from "./client.js";
import { CancelledError, LockServiceError } from "./errors.js";
import type { Leadership, Lock } from "./lock.js";
import { rawMembers } from "./rawjson.js";
import type { Share } from "./wire.js";

const USAGE = "usage: driver --addrs HOST:PORT[,HOST:PORT...] [--name NAME] [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]";
/** At close, held locks are released and withdrawals settle within this. */
const CLOSE_WITHIN_MS = 5000;

/**
 * A command's id (or a cancel's target): `text` is its JSON text as given,
 * echoed verbatim (an integer beyond 2^53 keeps every digit), `key` finds
 * it (the same integer written alike or not, the same string).
 */
interface Id {
  text: string;
  key: string;
}
const NULL_ID: Id = { text: "null", key: "null" };
type Json = Record<string, unknown>;

function badArguments(message: string): never {
  process.stderr.write(`lockservice driver: ${message.replace(/\s*\n\s*/g, " ")} (${USAGE})\n`);
  process.exit(2);
}

interface Arguments {
  addrs: string;
  name?: string;
  tlsCa?: string;
  tlsCert?: string;
  tlsKey?: string;
}

function parseArguments(argv: string[]): Arguments {
  const values: Record<string, string> = {};
  const known = new Set(["--addrs", "--name", "--tls-ca", "--tls-cert", "--tls-key"]);
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "-h" || arg === "--help") {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    }
    const eq = arg.indexOf("=");
    const flag = arg.startsWith("--") && eq > 0 ? arg.slice(0, eq) : arg;
    if (!known.has(flag)) badArguments(`unknown argument ${JSON.stringify(arg)}`);
    let value: string;
    if (flag !== arg) value = arg.slice(eq + 1);
    else {
      if (i + 1 >= argv.length) badArguments(`${flag} needs a value`);
      value = argv[++i]!;
    }
    if (flag in values) badArguments(`${flag} given twice`);
    values[flag] = value;
  }
  if (values["--addrs"] === undefined) badArguments("--addrs is required");
  const args: Arguments = { addrs: values["--addrs"]! };
  if (values["--name"] !== undefined) args.name = values["--name"];
  if (values["--tls-ca"] !== undefined) args.tlsCa = values["--tls-ca"];
  if (values["--tls-cert"] !== undefined) args.tlsCert = values["--tls-cert"];
  if (values["--tls-key"] !== undefined) args.tlsKey = values["--tls-key"];
  if ((args.tlsCert === undefined) !== (args.tlsKey === undefined)) badArguments("--tls-cert and --tls-key go together");
  if (args.tlsCert !== undefined && args.tlsCa === undefined) badArguments("--tls-cert and --tls-key need --tls-ca");
  return args;
}

function readFile(path: string, flag: string): Buffer {
  try {
    return fs.readFileSync(path);
  } catch (error) {
    badArguments(`${flag} ${path}: ${(error as Error).message}`);
  }
}

function makeClient(args: Arguments): Client {
  let tlsOptions: tls.ConnectionOptions | undefined;
  if (args.tlsCa !== undefined) {
    tlsOptions = { ca: readFile(args.tlsCa, "--tls-ca") };
    if (args.tlsCert !== undefined) {
      tlsOptions.cert = readFile(args.tlsCert, "--tls-cert");
      tlsOptions.key = readFile(args.tlsKey!, "--tls-key");
    }
  }
  try {
    return connect(args.addrs, { name: args.name, tls: tlsOptions });
  } catch (error) {
    badArguments((error as Error).message);
  }
}

/** A malformed command: answered `bad_command`. */
class BadCommand extends Error {}

function field(command: Json, name: string, type: "string" | "number" | "boolean", required: true): string | number | boolean;
function field(command: Json, name: string, type: "string" | "number" | "boolean", required: false): string | number | boolean | undefined;
function field(command: Json, name: string, type: "string" | "number" | "boolean", required: boolean): string | number | boolean | undefined {
  const value = command[name];
  // An optional field given as null is an omitted one.
  if (value === undefined || (value === null && !required)) {
    if (required) throw new BadCommand(`missing field ${JSON.stringify(name)}`);
    return undefined;
  }
  if (typeof value !== type) throw new BadCommand(`field ${JSON.stringify(name)} must be a ${type}`);
  return value as string | number | boolean;
}

const str = (c: Json, n: string): string => field(c, n, "string", true) as string;
const num = (c: Json, n: string): number => field(c, n, "number", true) as number;

interface Entry {
  id: Id;
  op: string;
  finished: boolean;
  controller: AbortController | null;
  done: Promise<void>;
}

class Driver {
  private readonly client: Client;
  private readonly entries = new Map<string, Entry>();
  private readonly held = new Map<string, Lock>();
  private readonly leaderships = new Map<string, Set<Leadership>>();
  /** Withdrawals and releases of crossed grants still under way. */
  private readonly settling = new Set<Promise<void>>();
  private closing = false;

  constructor(client: Client) {
    this.client = client;
  }

  /** Writes one line: `object`, after `"id":<id as given>` when `id` is given. */
  write(object: Json, id?: Id): void {
    let text = JSON.stringify(object);
    if (id !== undefined) text = text === "{}" ? `{"id":${id.text}}` : `{"id":${id.text},${text.slice(1)}`;
    try {
      process.stdout.write(`${text}\n`);
    } catch {
      // stdout gone: nothing to tell anyone.
    }
  }

  line(text: string): void {
    if (this.closing) return;
    if (text.trim() === "") return;
    let command: unknown;
    try {
      command = JSON.parse(text);
    } catch {
      this.write({ ok: false, error: "bad_command", message: "not JSON" }, NULL_ID);
      return;
    }
    if (typeof command !== "object" || command === null || Array.isArray(command)) {
      this.write({ ok: false, error: "bad_command", message: "a command is a JSON object" }, NULL_ID);
      return;
    }
    const c = command as Json;
    const raw = rawMembers(text);
    const id = idOf(c["id"], raw?.get("id"));
    if (id === null) {
      this.write({ ok: false, error: "bad_command", message: "missing or bad id (an integer or a string)" }, NULL_ID);
      return;
    }
    const op = c["op"];
    if (op === "close") {
      void this.close(id);
      return;
    }
    let run: ((signal: AbortSignal) => Promise<Json>) | null;
    let cancellable = false;
    try {
      switch (op) {
        case "acquire":
          run = this.acquire(c);
          cancellable = true;
          break;
        case "release":
          run = this.release(c);
          break;
        case "renew":
          run = this.renew(c);
          break;
        case "cancel":
          this.cancel(id, c, raw?.get("target"));
          return;
        case "observe":
          run = this.observe(c);
          cancellable = true;
          break;
        case "campaign":
          run = this.campaign(c);
          cancellable = true;
          break;
        case "leader":
          run = this.leader(c);
          break;
        case "resign":
          run = this.resign(c);
          break;
        default:
          throw new BadCommand(`unknown op ${JSON.stringify(op)}`);
      }
    } catch (error) {
      if (error instanceof BadCommand) this.write({ ok: false, error: "bad_command", message: error.message }, id);
      else this.write({ ok: false, error: errorCode(error), message: (error as Error).message }, id);
      return;
    }
    this.start(id, op as string, run, cancellable);
  }

  private start(id: Id, op: string, run: (signal: AbortSignal) => Promise<Json>, cancellable: boolean): void {
    const controller = new AbortController();
    const entry: Entry = { id, op, finished: false, controller: cancellable ? controller : null, done: Promise.resolve() };
    const key = id.key;
    this.entries.set(key, entry);
    entry.done = (async () => {
      let result: Json;
      try {
        result = await run(controller.signal);
      } catch (error) {
        if (error instanceof CancelledError) {
          // Written once the withdrawal is settled (a crossed grant released).
          await within(error.settled, CLOSE_WITHIN_MS);
        }
        result = { ok: false, error: errorCode(error), message: (error as Error).message };
      }
      if (!entry.finished) {
        entry.finished = true;
        this.write(result, id);
      }
      if (this.entries.get(key) === entry) this.entries.delete(key);
    })();
  }

  private acquire(c: Json): (signal: AbortSignal) => Promise<Json> {
    const key = str(c, "key");
    const lease = num(c, "lease");
    const wait = num(c, "wait");
    const share = c["share"];
    if (!(share === undefined || share === null || typeof share === "string" || typeof share === "number")) {
      throw new BadCommand('field "share" must be null, "r" or an integer');
    }
    const keepalive = (field(c, "keepalive", "boolean", false) as boolean | undefined) ?? false;
    return async (signal) => {
      const lock = await this.client.acquire(key, { lease, wait, share: share as Share, keepalive, signal });
      this.held.set(`${lock.key} ${lock.token}`, lock);
      if (keepalive) {
        lock.on("lost", () => {
          this.held.delete(`${lock.key} ${lock.token}`);
          this.write({ event: "lost", key: lock.key, token: lock.token });
        });
      }
      return { ok: true, token: lock.token };
    };
  }

  private release(c: Json): (signal: AbortSignal) => Promise<Json> {
    const key = str(c, "key");
    const token = str(c, "token");
    return async () => {
      const lock = this.held.get(`${key} ${token}`);
      try {
        if (lock !== undefined) await lock.release();
        else await this.client.release(key, token);
      } catch (error) {
        if (error instanceof LockServiceError && error.code === "stale") this.held.delete(`${key} ${token}`);
        throw error;
      }
      this.held.delete(`${key} ${token}`);
      return { ok: true };
    };
  }

  private renew(c: Json): (signal: AbortSignal) => Promise<Json> {
    const key = str(c, "key");
    const token = str(c, "token");
    const lease = num(c, "lease");
    return async () => {
      const lock = this.held.get(`${key} ${token}`);
      if (lock !== undefined && !lock.released) await lock.renew(lease);
      else await this.client.renew(key, token, lease);
      return { ok: true };
    };
  }

  private observe(c: Json): (signal: AbortSignal) => Promise<Json> {
    const key = str(c, "key");
    const token = str(c, "token");
    const wait = num(c, "wait");
    return async (signal) => {
      const state = await this.client.observeOnce(key, token, wait, { signal });
      if (!state.changed) {
        return {
          ok: false,
          error: "timeout",
          message: `${key}: nothing changed within ${wait} s`,
          token: state.token,
        };
      }
      return { ok: true, token: state.token, holder: state.holder, value: state.value };
    };
  }

  private campaign(c: Json): (signal: AbortSignal) => Promise<Json> {
    const election = str(c, "election");
    const value = str(c, "value");
    const lease = (field(c, "lease", "number", false) as number | undefined) ?? 10;
    return async (signal) => {
      const leadership = await this.client.campaign(election, value, { lease, signal });
      let set = this.leaderships.get(election);
      if (set === undefined) this.leaderships.set(election, (set = new Set()));
      set.add(leadership);
      leadership.on("lost", () => {
        this.leaderships.get(election)?.delete(leadership);
        this.write({ event: "lost", key: election, token: leadership.token });
      });
      return { ok: true, token: leadership.token };
    };
  }

  private leader(c: Json): (signal: AbortSignal) => Promise<Json> {
    const election = str(c, "election");
    return async (signal) => {
      const state = await this.client.leader(election, { signal });
      return { ok: true, value: state.value, token: state.token, holder: state.holder };
    };
  }

  private resign(c: Json): (signal: AbortSignal) => Promise<Json> {
    const election = str(c, "election");
    return async () => {
      const set = this.leaderships.get(election);
      if (set !== undefined) {
        for (const leadership of [...set]) {
          await leadership.resign();
          set.delete(leadership);
        }
        if (set.size === 0) this.leaderships.delete(election);
      }
      return { ok: true };
    };
  }

  private cancel(id: Id, c: Json, rawTarget: string | undefined): void {
    const target = idOf(c["target"], rawTarget);
    if (target === null) {
      this.write({ ok: false, error: "bad_command", message: 'field "target" must be an integer or a string' }, id);
      return;
    }
    const entry = this.entries.get(target.key);
    if (entry === undefined || entry.finished || entry.controller === null) {
      this.write({ ok: false, error: "unknown_target", message: `no pending acquire, observe or campaign ${target.text}` }, id);
      return;
    }
    entry.controller.abort();
    void entry.done.then(() => {
      if (!this.closing) this.write({ ok: true }, id);
    });
  }

  /** `close` (id given) or end of stdin (id undefined). */
  async close(id?: Id): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    const pending = [...this.entries.values()].filter((e) => !e.finished);
    for (const entry of pending) {
      entry.finished = true;
      this.write({ ok: false, error: "cancelled", message: "the driver is closing" }, entry.id);
      entry.controller?.abort();
    }
    const work: Array<Promise<unknown>> = pending.map((e) => e.done);
    for (const lock of this.held.values()) work.push(lock.release().catch(() => {}));
    for (const set of this.leaderships.values()) for (const l of set) work.push(l.resign().catch(() => {}));
    await within(Promise.all(work).then(() => {}), CLOSE_WITHIN_MS);
    await within(this.client.close(), 1000);
    if (id !== undefined) this.write({ ok: true }, id);
    process.exit(0);
  }
}

/**
 * The id (or target) `value` as parsed, `raw` its JSON text: a string, or
 * an integer (exact, however large); null for anything else.
 */
function idOf(value: unknown, raw: string | undefined): Id | null {
  if (typeof value === "string") return { text: JSON.stringify(value), key: `s${value}` };
  if (typeof value !== "number" || !Number.isFinite(value) || raw === undefined) return null;
  const integer = exactInteger(raw);
  return integer === null ? null : { text: raw, key: `n${integer}` };
}

/** The integer a JSON number's text means, in decimal, or null when it is not an integer. */
function exactInteger(text: string): string | null {
  const m = /^(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?$/.exec(text);
  if (m === null) return null;
  const fraction = m[3] ?? "";
  let digits = (m[2]! + fraction).replace(/^0+(?=[0-9])/, "");
  const exponent = Number(m[4] ?? "0") - fraction.length;
  if (!Number.isSafeInteger(exponent) || exponent > 400) return null;
  if (exponent >= 0) digits += "0".repeat(exponent);
  else {
    const cut = digits.length + exponent;
    const dropped = cut > 0 ? digits.slice(cut) : digits;
    if (!/^0*$/.test(dropped)) return null;
    digits = cut > 0 ? digits.slice(0, cut) : "0";
  }
  const value = BigInt(digits);
  return (m[1] === "-" ? -value : value).toString();
}

function errorCode(error: unknown): string {
  if (error instanceof LockServiceError && error.code !== "lost") return error.code;
  return "no_connection";
}

function within(promise: Promise<void>, ms: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, ms);
    promise.then(
      () => {
        clearTimeout(timer);
        resolve();
      },
      () => {
        clearTimeout(timer);
        resolve();
      },
    );
  });
}

function main(): void {
  const args = parseArguments(process.argv.slice(2));
  const client = makeClient(args);
  const driver = new Driver(client);
  process.stdout.on("error", () => {});
  const input = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  input.on("line", (text) => driver.line(text));
  input.on("close", () => void driver.close());
}

main();
