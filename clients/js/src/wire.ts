/**
 * The wire grammar of the client port: keys, seconds, tokens,
 * shares, and the pairing of answers with requests.
 */

import { InvalidError } from "./errors.js";

/** Longest key, `P` word or `I` name, in bytes of UTF-8. */
export const MAX_KEY_BYTES = 250;
/** Largest token: 2^64 - 1. */
export const MAX_TOKEN = (1n << 64n) - 1n;
/** Most semaphore slots. */
export const MAX_SLOTS = 65535;

/** How a key is shared: `undefined` exclusive, `"r"` a read lock, n (2..65535) a semaphore. */
export type Share = undefined | null | "r" | number;

/**
 * Why `text` is not a valid key (1-250 bytes of UTF-8, no space, no control
 * character), or `null` when it is one.
 */
export function keyProblem(text: unknown): string | null {
  if (typeof text !== "string") return "not a string";
  if (text.length === 0) return "empty";
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const next = text.charCodeAt(i + 1);
      if (!(next >= 0xdc00 && next <= 0xdfff)) return "not valid UTF-8 (a lone surrogate)";
      i++;
      continue;
    }
    if (c >= 0xdc00 && c <= 0xdfff) return "not valid UTF-8 (a lone surrogate)";
    if (c === 0x20) return "contains a space";
    if (c <= 0x1f || (c >= 0x7f && c <= 0x9f)) return "contains a control character";
  }
  if (Buffer.byteLength(text, "utf8") > MAX_KEY_BYTES) return `longer than ${MAX_KEY_BYTES} bytes`;
  return null;
}

/** Throws {@link InvalidError} unless `text` is a valid key. */
export function checkKey(text: unknown, what = "key"): string {
  const problem = keyProblem(text);
  if (problem !== null) throw new InvalidError(`invalid ${what} ${JSON.stringify(text)}: ${problem}`);
  return text as string;
}

/**
 * Seconds in the wire grammar `[0-9]+(\.[0-9]+)?`, to the microsecond,
 * never with an exponent; a positive value is at least `0.000001`.
 */
export function formatSeconds(value: number): string {
  if (!Number.isFinite(value) || value < 0) throw new InvalidError(`invalid seconds ${value}`);
  let text: string;
  if (value >= 1e21) {
    // toFixed switches to an exponent here; such a number is an integer.
    text = BigInt(value).toString();
  } else {
    text = value.toFixed(6);
    if (text.includes(".")) text = text.replace(/0+$/, "").replace(/\.$/, "");
  }
  if (value > 0 && /^0(\.0*)?$/.test(text)) return "0.000001";
  return text;
}

/** Checks a lease: a finite number > 0. */
export function checkLease(lease: unknown, what = "lease"): number {
  if (typeof lease !== "number" || !Number.isFinite(lease) || !(lease > 0)) {
    throw new InvalidError(`invalid ${what} ${String(lease)}: a number of seconds > 0`);
  }
  return lease;
}

/** Checks a wait: a finite number >= 0 (0: no limit). */
export function checkWait(wait: unknown): number {
  if (typeof wait !== "number" || !Number.isFinite(wait) || !(wait >= 0)) {
    throw new InvalidError(`invalid wait ${String(wait)}: a number of seconds >= 0 (0: no limit)`);
  }
  return wait;
}

/** The share field of an acquire, normalised: `""` (exclusive), `"r"`, or the slot count. */
export function shareField(share: unknown): string {
  if (share === undefined || share === null || share === 1) return "";
  if (share === "r") return "r";
  if (typeof share === "number" && Number.isInteger(share) && share >= 2 && share <= MAX_SLOTS) {
    return String(share);
  }
  throw new InvalidError(
    `invalid share ${JSON.stringify(share)}: null or 1 (exclusive), "r" (read), or an integer 2..${MAX_SLOTS} (semaphore slots)`,
  );
}

/** A token as the canonical decimal string; throws {@link InvalidError} for anything else. */
export function checkToken(token: unknown): string {
  let text: string;
  if (typeof token === "bigint") text = token.toString();
  else if (typeof token === "string") text = token;
  else throw new InvalidError(`invalid token ${String(token)}: a decimal string (or a bigint)`);
  if (!/^[0-9]+$/.test(text) || text.length > 40) throw new InvalidError(`invalid token ${JSON.stringify(text)}: [0-9]+`);
  const value = BigInt(text);
  if (value > MAX_TOKEN) throw new InvalidError(`invalid token ${text}: more than 2^64-1`);
  return value.toString();
}

/**
 * The (op, key) pair of the request that an answer line answers, as a map
 * key `"<op> <key>"`, or `null` for a line that answers nothing we send.
 */
export function pairOf(fields: string[]): string | null {
  const kind = fields[0];
  switch (kind) {
    case "A":
    case "T":
      return fields.length >= 2 ? `A ${fields[1]}` : null;
    case "R":
    case "N":
    case "C":
    case "O":
    case "P":
    case "I":
      return fields.length >= 2 ? `${kind} ${fields[1]}` : null;
    case "M":
    case "E":
      return fields.length >= 3 ? `${fields[1]} ${fields[2]}` : null;
    default:
      return null;
  }
}

/** A name's value: the part before its last `#` (the whole name when it has none). */
export function valueOfName(name: string): string {
  const at = name.lastIndexOf("#");
  return at < 0 ? name : name.slice(0, at);
}

export interface Address {
  host: string;
  port: number;
  /** As written (`host:port`, `[v6]:port`). */
  text: string;
}

/** Parses `host:port` or `[v6]:port`; throws {@link InvalidError}. */
export function parseAddress(text: string): Address {
  const trimmed = text.trim();
  let host: string;
  let portText: string;
  const bracket = /^\[([^\]]+)\]:([0-9]+)$/.exec(trimmed);
  if (bracket) {
    host = bracket[1]!;
    portText = bracket[2]!;
  } else {
    const at = trimmed.lastIndexOf(":");
    if (at <= 0) throw new InvalidError(`invalid address ${JSON.stringify(text)}: host:port`);
    host = trimmed.slice(0, at);
    portText = trimmed.slice(at + 1);
    if (host.includes(":")) throw new InvalidError(`invalid address ${JSON.stringify(text)}: write an IPv6 address as [addr]:port`);
  }
  if (!/^[0-9]{1,5}$/.test(portText)) throw new InvalidError(`invalid address ${JSON.stringify(text)}: bad port`);
  const port = Number(portText);
  if (port < 1 || port > 65535) throw new InvalidError(`invalid address ${JSON.stringify(text)}: port out of range`);
  if (host.length === 0 || /\s/.test(host)) throw new InvalidError(`invalid address ${JSON.stringify(text)}: bad host`);
  return { host, port, text: trimmed };
}

/** Addresses from `"a:1,b:2"` or an array of `host:port` strings. */
export function parseAddresses(addrs: string | readonly string[]): Address[] {
  const list = typeof addrs === "string" ? addrs.split(",") : [...addrs];
  const parsed = list.map((a) => a.trim()).filter((a) => a.length > 0).map(parseAddress);
  if (parsed.length === 0) throw new InvalidError("at least one address (host:port) is needed");
  return parsed;
}
