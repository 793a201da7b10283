/**
 * The lockservice client.
 *
 *     const client = connect("10.0.0.1:7700,10.0.0.2:7700", { name: "billing" });
 *     const lock = await client.acquire("orders/42", { lease: 30, wait: 5 });
 *     try { ... } finally { await lock.release(); }
 */

import { randomBytes } from "node:crypto";
import type * as tls from "node:tls";

import { Connection, monotonic } from "./connection.js";
import {
  CancelledError,
  ConnectionDropped,
  InvalidError,
  LockServiceError,
  NoConnectionError,
  RejectedError,
  StaleError,
  TimeoutError,
} from "./errors.js";
import { Leadership, Lock, type LockOwner } from "./lock.js";
import { Pool, sleep, type Slot } from "./pool.js";
import { later, type Timer } from "./timer.js";
import {
  MAX_KEY_BYTES,
  checkKey,
  checkLease,
  checkToken,
  checkWait,
  formatSeconds,
  keyProblem,
  parseAddresses,
  shareField,
  valueOfName,
  type Address,
  type Share,
} from "./wire.js";

export const VERSION = "0.2.0";

/** A release is retried this long, */
export const RELEASE_RETRY_FOR_MS = 5000;
/** this often (renewals too). */
export const RETRY_EVERY_MS = 200;
/** `M ... *` (no active known): the request is retried this often, */
const NO_ACTIVE_RETRY_MS = 100;
/** for at most this long when its wait is 0 (else until its wait runs out). */
const NO_ACTIVE_FOR_MS = 10_000;
const MAX_REDIRECTS = 20;
/** An acquire with a wait ends at most this long after its wait ran out, whatever the node does. */
const ACQUIRE_GRACE_MS = 2000;
/** With no connection up, a request waits at most this long for one. */
const CONNECT_WAIT_MS = 10_000;
/** An `O` asks for at most this wait; a longer observation is several of them. */
const OBSERVE_CHUNK_S = 10;
/** An `O` not answered this long after its wait is presumed lost on a stalled node. */
const OBSERVE_GRACE_MS = 3000;
/** A cancelled campaign's connection waits at most this for its withdrawal to settle. */
const CANCEL_SETTLE_MS = 5000;
/** The client's instance id: this many hex digits, after `#` in its connection names. */
const INSTANCE_HEX = 12;
/** The longest name a client can have: `<name>#<instance>` must be a valid `I` word. */
export const MAX_NAME_BYTES = MAX_KEY_BYTES - 1 - INSTANCE_HEX;

export interface ConnectOptions {
  /**
   * This client's name (the key grammar, at most 237 bytes). Connections are
   * named `<name>#<instance id>` (`I <name>#<id>`), so nodes show holders
   * and waiters by it.
   */
  name?: string;
  /**
   * Connect with TLS: `true` (the system's CAs), or the options of Node's
   * `tls.connect` (`ca`, `cert`, `key`, `servername`, ...). The node's
   * certificate is verified against the host of each address (an IP
   * address against an IP SAN).
   */
  tls?: boolean | tls.ConnectionOptions;
}

export interface AcquireOptions {
  /** Seconds the grant lasts unless renewed (> 0). Default 30. */
  lease?: number;
  /** Seconds to wait for the grant; 0 (the default) waits without limit. */
  wait?: number;
  /** `null`/`1` exclusive (default), `"r"` a read lock, 2..65535 one slot of a semaphore. */
  share?: Share;
  /** Renew every third of the lease until released or lost. */
  keepalive?: boolean;
  /** Aborting it withdraws the pending acquire (`C key`); a grant that crossed it is released. */
  signal?: AbortSignal;
}

export interface CampaignOptions {
  /** The leadership's lease in seconds, kept alive. Default 10. */
  lease?: number;
  /** Aborting it withdraws the candidacy. */
  signal?: AbortSignal;
}

/** Who holds a key (its newest live grant), as `O` tells it. */
export interface HolderState {
  /** The newest live grant's token, `"0"` when nothing holds the key. */
  token: string;
  tokenBigInt: bigint;
  /** The holder's connection name, `null` when free or unnamed (`-`). */
  holder: string | null;
  /** The holder name's value (the part before its last `#`), `null` when `holder` is. */
  value: string | null;
}

export interface ObserveResult extends HolderState {
  /** False when the wait ran out with the token sent still the newest. */
  changed: boolean;
}

function stateOf(fields: string[]): HolderState {
  const token = fields[2] ?? "0";
  if (!/^[0-9]+$/.test(token)) throw new NoConnectionError(`a malformed answer: ${fields.join(" ")}`);
  const raw = fields[3];
  const holder = raw === undefined || raw === "-" ? null : raw;
  const canonical = BigInt(token);
  return { token: canonical.toString(), tokenBigInt: canonical, holder, value: holder === null ? null : valueOfName(holder) };
}

/** Why a campaign value cannot be a name's value, or null. */
export function campaignValueProblem(value: unknown): string | null {
  if (typeof value !== "string") return "not a string";
  if (value.length === 0) return "empty";
  const problem = keyProblem(value);
  if (problem !== null) return problem.replace(`longer than ${MAX_KEY_BYTES}`, `longer than ${MAX_NAME_BYTES}`);
  if (Buffer.byteLength(value, "utf8") > MAX_NAME_BYTES) {
    return `longer than ${MAX_NAME_BYTES} bytes (the client adds #<instance id>)`;
  }
  return null;
}

interface Answered {
  fields: string[];
  sentAt: number;
}

/**
 * Connections to one node that fail within this of each other fail
 * together (the node died or restarted): one try of a request, not one
 * per connection.
 */
const SAME_MOMENT_MS = 1000;

/**
 * The tries a request (an acquire, an observe) has used: each connection
 * that carried it and dropped (or never answered) is one, except that
 * connections to one node that fail in the same moment share one try
 * (the node died: its connections all drop, the request may have been
 * re-sent on one before its drop was seen). A connection made after the
 * failure that counted is a new try. Only the request's own connections
 * count: it never hears of the others.
 */
class Tries {
  used = 0;
  /** Per node address: when its failure that counted happened. */
  private readonly counted = new Map<string, number>();

  constructor(private readonly limit: number) {}

  /** `conn`, which carried the request, failed; true when no try is left. */
  failed(conn: Connection): boolean {
    const at = conn.closedAt || monotonic();
    const address = conn.address.text;
    const previous = this.counted.get(address);
    const sameMoment = previous !== undefined && conn.readyAt <= previous && at - previous <= SAME_MOMENT_MS;
    if (!sameMoment) {
      this.used++;
      this.counted.set(address, at);
    }
    return this.used >= this.limit;
  }
}

/** Lets the I/O already in (other connections closing) be seen before a re-send picks a connection. */
const settleIO = (): Promise<void> => new Promise<void>((resolve) => setImmediate(resolve));

class GaveUp extends Error {}
class Abandoned extends Error {}

/**
 * One idempotent request (`R`, `N`) sent at once, then again every
 * `every` ms (at start + k * every, each on a connection not already
 * carrying a copy) until an answer settles it or `giveUpAt` comes (then
 * {@link GaveUp}). A redirect is followed at once; `M ... *` and drops wait
 * for the next tick. `OK` settles at once; `STALE` only when no other copy
 * is on its way (a retry may overtake the copy that did the work) or at
 * `giveUpAt`.
 */
class Retried {
  private readonly carrying = new Set<Slot>();
  private stale: Answered | null = null;
  private problem = "no connection up";
  private sends = 0;
  private started = 0;
  private tickTimer: NodeJS.Timeout | null = null;
  private endTimer: Timer | null = null;
  private done = false;
  private resolve!: (a: Answered) => void;
  private reject!: (e: Error) => void;
  readonly result: Promise<Answered>;

  constructor(
    private readonly client: Client,
    private readonly pool: Pool,
    private readonly op: string,
    private readonly key: string,
    private readonly line: string,
    private readonly every: number,
    private readonly giveUpAt: number,
    private readonly wanted: () => boolean,
  ) {
    this.result = new Promise<Answered>((res, rej) => {
      this.resolve = res;
      this.reject = rej;
    });
  }

  start(): Promise<Answered> {
    this.started = monotonic();
    this.endTimer = later(() => this.end(), this.giveUpAt - this.started);
    this.client.retrying.add(this);
    this.tick();
    return this.result;
  }

  finish(value: Answered | Error): void {
    if (this.done) return;
    this.done = true;
    this.client.retrying.delete(this);
    if (this.tickTimer !== null) clearTimeout(this.tickTimer);
    this.endTimer?.clear();
    if (value instanceof Error) this.reject(value);
    else this.resolve(value);
  }

  private tick(): void {
    this.tickTimer = null;
    if (this.done) return;
    if (!this.wanted()) {
      this.finish(new Abandoned());
      return;
    }
    const slot = this.freeSlot();
    if (slot !== null) this.sendOn(slot);
    this.sends++;
    const at = this.started + this.sends * this.every;
    if (at < this.giveUpAt - 0.001) this.tickTimer = setTimeout(() => this.tick(), Math.max(0, at - monotonic()));
  }

  private end(): void {
    this.endTimer = null;
    // Copies still unanswered: their connections may be stalled.
    for (const slot of this.carrying) slot.conn?.suspect();
    this.finish(this.stale ?? new GaveUp(this.problem));
  }

  private freeSlot(): Slot | null {
    for (let i = 0; i < this.pool.slots.length; i++) {
      const slot = this.pool.pick();
      if (slot === null) return null;
      if (!this.carrying.has(slot)) return slot;
    }
    return null;
  }

  private sendOn(slot: Slot): void {
    if (this.done) return;
    if (!this.wanted()) {
      this.finish(new Abandoned());
      return;
    }
    const conn = slot.conn;
    if (conn === null) return;
    const sentAt = monotonic();
    this.carrying.add(slot);
    conn.request(this.op, this.key, this.line).then(
      (fields) => this.answered(slot, fields, sentAt),
      (error: Error) => this.dropped(slot, error),
    );
  }

  private answered(slot: Slot, fields: string[], sentAt: number): void {
    this.carrying.delete(slot);
    if (this.done) return;
    if (fields[0] === "M") {
      const target = fields[3] ?? "*";
      if (target === "*") {
        this.problem = "no active node (M *)";
        this.settleStale();
        return;
      }
      this.problem = `redirected to ${target}`;
      slot.switchTo(target).then(
        () => {
          if (slot.up && !this.carrying.has(slot)) this.sendOn(slot);
        },
        () => {},
      );
      return;
    }
    if (fields[0] === "E") {
      this.finish(new RejectedError(fields.slice(3).join(" ")));
      return;
    }
    if (fields[2] === "STALE") {
      this.stale = { fields, sentAt };
      this.settleStale();
      return;
    }
    if (fields[2] === "OK") {
      this.finish({ fields, sentAt });
      return;
    }
    this.problem = `unexpected answer ${JSON.stringify(fields.join(" "))}`;
  }

  private dropped(slot: Slot, error: Error): void {
    this.carrying.delete(slot);
    this.problem = `connection dropped (${error.message})`;
    this.settleStale();
  }

  private settleStale(): void {
    if (this.stale !== null && this.carrying.size === 0) this.finish(this.stale);
  }
}

/** One acquire in progress (see {@link Client.acquire}). */
class AcquireRun {
  done = false;
  /** The caller no longer wants the result: a grant that comes is released. */
  abandoned = false;
  /** The connection carrying our outstanding `A`, while it is outstanding. */
  private sentOn: Connection | null = null;
  private sends = 0;
  private readonly internal = new AbortController();
  private guard: Timer | null = null;
  private loopDone: Promise<void> = Promise.resolve();
  private onUserAbort: (() => void) | null = null;

  constructor(
    private readonly client: Client,
    private readonly pool: Pool,
    private readonly lockPool: Pool,
    private readonly key: string,
    private readonly lease: number,
    private readonly leaseText: string,
    private readonly wait: number,
    private readonly waitText: string,
    private readonly share: string,
    private readonly keepalive: boolean,
    private readonly signal: AbortSignal | undefined,
    private readonly resolve: (lock: Lock) => void,
    private readonly reject: (e: Error) => void,
  ) {}

  start(): void {
    if (this.signal?.aborted) {
      this.done = true;
      this.reject(new CancelledError(`acquire of ${JSON.stringify(this.key)} cancelled before it was sent`, Promise.resolve(), { cause: this.signal.reason }));
      return;
    }
    if (this.signal) {
      this.onUserAbort = () => this.cancel(new CancelledError(`acquire of ${JSON.stringify(this.key)} cancelled`, undefined, { cause: this.signal!.reason }));
      this.signal.addEventListener("abort", this.onUserAbort, { once: true });
    }
    if (this.wait > 0) {
      this.guard = later(() => {
        this.guard = null;
        if (this.done) return;
        if (this.sentOn !== null) {
          this.sentOn.suspect();
          this.giveUp(new TimeoutError(`no answer for ${JSON.stringify(this.key)} within ${this.wait} s (+${ACQUIRE_GRACE_MS / 1000} s)`));
        } else {
          this.giveUp(new NoConnectionError(`no connection carried the acquire of ${JSON.stringify(this.key)} within ${this.wait} s: ${this.pool.lastError()}`));
        }
      }, this.wait * 1000 + ACQUIRE_GRACE_MS);
    }
    this.client.acquiring.add(this);
    this.loopDone = this.loop().then(
      () => {},
      (error: unknown) => this.settle(error instanceof Error ? error : new Error(String(error))),
    ).finally(() => this.cleanup());
  }

  private cleanup(): void {
    this.client.acquiring.delete(this);
    this.guard?.clear();
    this.guard = null;
    if (this.signal && this.onUserAbort) this.signal.removeEventListener("abort", this.onUserAbort);
  }

  private settle(result: Lock | Error): void {
    if (this.done) return;
    this.done = true;
    this.guard?.clear();
    this.guard = null;
    if (result instanceof Error) this.reject(result);
    else this.resolve(result);
  }

  /** Ends the acquire now with `error`; what is on its way is withdrawn or released. */
  giveUp(error: Error): void {
    if (this.done) return;
    this.abandoned = true;
    this.internal.abort(error);
    this.settle(error);
  }

  /**
   * The caller gave up: an `A` on its way is withdrawn at once with `C key`
   * on its connection; the loop then sees its answer (`T`, or a grant that
   * crossed the withdrawal, which it releases).
   */
  cancel(error: CancelledError | Error): void {
    if (this.done) return;
    const conn = this.sentOn;
    let withdrawn: Promise<unknown> = Promise.resolve();
    if (conn !== null) {
      withdrawn = conn.request("C", this.key, `C ${this.key}\n`).catch(() => {});
    }
    // Settled once the `C` is answered (after the `T`, or after the grant
    // that crossed it) and the loop is done (a crossed grant released).
    const settled = Promise.all([this.loopDone, withdrawn]).then(() => {});
    const final =
      error instanceof CancelledError ? new CancelledError(error.message, settled, { cause: error.cause }) : error;
    this.giveUp(final);
  }

  private async loop(): Promise<void> {
    const pool = this.pool;
    const key = this.key;
    const started = monotonic();
    const deadline = this.wait > 0 ? started + this.wait * 1000 : null;
    // With no connection up, wait for one this long: from the start, and
    // again from each drop (a long-pending request meeting a failover).
    let connectUntil = started + CONNECT_WAIT_MS;
    const tries = new Tries(pool.slots.length);
    let redirects = 0;
    let noActiveUntil: number | null = null;
    let prefer: Slot | null = null;
    // The first send waited for its turn (another A of this key on every connection).
    let delayed = false;
    // The last answer was `M ... *`: no active node known.
    let noActive = false;
    for (;;) {
      if (this.abandoned) return;
      if (this.client.closed) throw new NoConnectionError("client closed");
      let slot = pool.claimNow("A", key, prefer);
      prefer = null;
      if (slot === undefined) {
        // Every connection has an A of this key outstanding: wait our turn.
        delayed = true;
        slot = await pool.claimLater("A", key, this.internal.signal);
      }
      if (slot === null) {
        // Waiting for a connection (a start, a reconnection) does not count:
        // the first send still asks for the whole wait, and the guard
        // bounds the acquire at wait + 2 s.
        await pool.whenUp(connectUntil, this.internal.signal);
        continue;
      }
      const conn = slot.conn!;
      if (this.abandoned) {
        pool.unclaim(conn, "A", key);
        return;
      }
      const now = monotonic();
      // The deadline ends re-sends only: the first try always goes out.
      if (deadline !== null && this.sends > 0 && now >= deadline) {
        pool.unclaim(conn, "A", key);
        if (noActive) throw new NoConnectionError("no active node (the cluster answers M *) within the wait");
        throw new TimeoutError(`no grant for ${JSON.stringify(key)} within ${this.wait} s`);
      }
      // A re-sent request (after a drop, a redirect) asks only for the wait
      // that is left, so the whole acquire stays bounded; the first asks
      // for the wait given, exactly.
      const waitText =
        deadline === null
          ? "0"
          : this.sends === 0 && !delayed
            ? this.waitText
            : formatSeconds(Math.max((deadline - now) / 1000, this.sends === 0 ? 0.000001 : 0.001));
      this.sends++;
      const sentAt = monotonic();
      this.sentOn = conn;
      let fields: string[];
      try {
        fields = await conn.request("A", key, `A ${key} ${this.leaseText} ${waitText}${this.share === "" ? "" : " " + this.share}\n`);
      } catch (error) {
        this.sentOn = null;
        pool.unclaim(conn, "A", key);
        if (this.abandoned) return;
        connectUntil = Math.max(connectUntil, monotonic() + CONNECT_WAIT_MS);
        if (tries.failed(conn)) {
          throw new NoConnectionError(`the connection dropped during the acquire of ${JSON.stringify(key)} (${tries.used} tries): ${(error as Error).message}`);
        }
        await settleIO();
        continue;
      }
      this.sentOn = null;
      pool.unclaim(conn, "A", key);
      noActive = fields[0] === "M" && (fields[3] ?? "*") === "*";
      switch (fields[0]) {
        case "A": {
          const token = fields[2] ?? "";
          if (!/^[0-9]+$/.test(token)) throw new NoConnectionError(`a malformed grant: ${fields.join(" ")}`);
          const canonical = BigInt(token).toString();
          if (this.abandoned || this.client.closed || this.done) {
            // Too late: the caller gave up, so give the key back at once.
            await this.client.releaseToken(this.lockPool, key, canonical).catch(() => {});
            return;
          }
          this.settle(this.client.hold(this.lockPool, key, canonical, this.lease, this.share, sentAt, this.keepalive));
          return;
        }
        case "T":
          if (this.abandoned) return;
          throw new TimeoutError(`no grant for ${JSON.stringify(key)} within ${this.wait} s`);
        case "M": {
          if (this.abandoned) return;
          const target = fields[3] ?? "*";
          if (target === "*") {
            // No active node right now (a handoff, a cluster starting).
            if (noActiveUntil === null) noActiveUntil = deadline ?? monotonic() + NO_ACTIVE_FOR_MS;
            if (monotonic() >= noActiveUntil) throw new NoConnectionError("no active node (the cluster answers M *)");
            await sleep(Math.min(NO_ACTIVE_RETRY_MS, Math.max(0, noActiveUntil - monotonic())), this.internal.signal);
            prefer = slot;
            continue;
          }
          redirects++;
          if (redirects > MAX_REDIRECTS) throw new NoConnectionError("too many redirects; no active node found");
          try {
            await slot.switchTo(target);
            prefer = slot;
            noActiveUntil = null;
          } catch {
            // The named active cannot be reached (it just died, say, and
            // the standby does not know yet): as with `M ... *`, try again
            // shortly, until the wait runs out (10 s when it is 0).
            redirects--;
            noActive = true;
            if (noActiveUntil === null) noActiveUntil = deadline ?? monotonic() + NO_ACTIVE_FOR_MS;
            if (monotonic() >= noActiveUntil) throw new NoConnectionError(`the active node named by a redirect (${target}) cannot be reached`);
            await sleep(Math.min(NO_ACTIVE_RETRY_MS, Math.max(0, noActiveUntil - monotonic())), this.internal.signal);
          }
          continue;
        }
        case "E":
          if (this.abandoned) return;
          throw new RejectedError(fields.slice(3).join(" "));
        default:
          throw new NoConnectionError(`an unexpected answer: ${fields.join(" ")}`);
      }
    }
  }
}

/** The client returned by {@link connect}. */
export class Client implements LockOwner {
  readonly name: string;
  /** Random per client; connections are named `<name>#<instance>`. */
  readonly instance: string;
  /** What the client sends as `I <...>`. */
  readonly wireName: string;
  readonly addresses: readonly Address[];
  closed = false;
  /** @internal */
  readonly pool: Pool;
  /** @internal */
  readonly acquiring = new Set<AcquireRun>();
  /** @internal */
  readonly retrying = new Set<Retried>();
  private readonly held = new Set<Lock>();
  private readonly tlsOptions: tls.ConnectionOptions | null;
  private readonly campaignPools = new Map<string, { pool: Pool; refs: number }>();
  private readonly closers = new Set<(e: Error) => void>();

  constructor(addrs: string | readonly string[], options: ConnectOptions = {}) {
    this.addresses = parseAddresses(addrs);
    const name = options.name ?? "";
    if (name !== "") {
      const problem = keyProblem(name);
      if (problem !== null) throw new InvalidError(`invalid name ${JSON.stringify(name)}: ${problem}`);
    }
    if (Buffer.byteLength(name, "utf8") > MAX_NAME_BYTES) {
      throw new InvalidError(`invalid name ${JSON.stringify(name)}: at most ${MAX_NAME_BYTES} bytes (the client adds #<instance id>)`);
    }
    this.name = name;
    this.instance = randomBytes(INSTANCE_HEX / 2).toString("hex");
    this.wireName = `${name}#${this.instance}`;
    const t = options.tls;
    this.tlsOptions = t === undefined || t === false ? null : t === true ? {} : { ...t };
    this.pool = new Pool([...this.addresses], this.wireName, this.tlsOptions);
    this.pool.start();
  }

  /** Resolves once a connection is up; rejects with {@link NoConnectionError} after `timeout` seconds or when every address failed an attempt. */
  whenConnected(timeout = 10): Promise<void> {
    return this.pool.whenUp(monotonic() + timeout * 1000);
  }

  // -- acquire ---------------------------------------------------------------

  /**
   * Acquires `key`: resolves with a {@link Lock} once granted; rejects with
   * {@link TimeoutError} (not granted within `wait`), {@link RejectedError}
   * (an `E` answer: a share that does not match the key's kind, a limit),
   * {@link NoConnectionError}, {@link InvalidError} (refused before
   * sending), or {@link CancelledError} (`signal` aborted: the acquire is
   * withdrawn with `C key`, and a grant that crossed it is released).
   */
  acquire(key: string, options: AcquireOptions = {}): Promise<Lock> {
    return this.acquireOn(this.pool, key, options);
  }

  /** A read lock: held beside other readers, never beside a writer (`acquire`). */
  readLock(key: string, options: Omit<AcquireOptions, "share"> = {}): Promise<Lock> {
    return this.acquire(key, { ...options, share: "r" });
  }

  /** One of `slots` (2..65535) slots of the semaphore `key`; all its acquirers must give the same `slots`. */
  semaphore(key: string, slots: number, options: Omit<AcquireOptions, "share"> = {}): Promise<Lock> {
    if (!Number.isInteger(slots) || slots < 2) {
      return Promise.reject(new InvalidError(`invalid slots ${slots}: an integer 2..65535`));
    }
    return this.acquire(key, { ...options, share: slots });
  }

  private acquireOn(pool: Pool, key: string, options: AcquireOptions, lockPool: Pool = this.pool): Promise<Lock> {
    return new Promise<Lock>((resolve, reject) => {
      let lease: number;
      let wait: number;
      let share: string;
      try {
        checkKey(key);
        lease = checkLease(options.lease ?? 30);
        wait = checkWait(options.wait ?? 0);
        share = shareField(options.share);
      } catch (error) {
        reject(error);
        return;
      }
      if (this.closed) {
        reject(new NoConnectionError("client closed"));
        return;
      }
      new AcquireRun(
        this, pool, lockPool, key, lease, formatSeconds(lease), wait, formatSeconds(wait), share,
        options.keepalive === true, options.signal, resolve, reject,
      ).start();
    });
  }

  /** @internal a grant: the Lock, its expiry watch and keep-alive. */
  hold(pool: Pool, key: string, token: string, lease: number, share: string, sentAt: number, keepalive: boolean): Lock {
    const lock = new Lock(this, pool, key, token, lease, share === "" ? null : share === "r" ? "r" : Number(share));
    this.held.add(lock);
    if (sentAt + lease * 1000 > monotonic()) this.confirmed(lock, sentAt, lease);
    // else: the grant came after its lease, counted from the send, had run
    // out (a long wait in the queue): the client cannot be sure it holds it.
    // Keep-alive renews at once; without it the lock is lost now.
    if (keepalive) lock.startKeepAlive();
    else if (lock.expiresAt === null) lock.markLost("the grant arrived after its lease (counted from the acquire's send) had run out");
    return lock;
  }

  private confirmed(lock: Lock, sentAt: number, lease: number): void {
    const expires = sentAt + lease * 1000;
    if (lock.expiresAt !== null && expires <= lock.expiresAt) return;
    lock.expiresAt = expires;
    lock.expiryTimer?.clear();
    lock.expiryTimer = later(() => this.expired(lock), expires - monotonic()).unref();
  }

  private expired(lock: Lock): void {
    lock.expiryTimer = null;
    if (lock.released || this.closed) return;
    if (lock.expiresAt !== null && lock.expiresAt > monotonic() + 1) {
      // Extended meanwhile.
      this.confirmed(lock, lock.expiresAt - lock.lease * 1000, lock.lease);
      return;
    }
    if (lock.keepAlive || lock.lastRenewError !== null) {
      lock.markLost(`the lease ran out on the client's clock while renewals failed (${lock.lastRenewError ?? "no answer"})`);
    } else {
      lock.markLost("the lease ran out (no renewal)");
    }
  }

  /** @internal */
  forgetLock(lock: Lock): void {
    this.held.delete(lock);
  }

  /** @internal keep-alive: the next renewal a third of the lease after the last confirmed send. */
  scheduleRenewal(lock: Lock): void {
    if (!lock.keepAlive || lock.released || lock.isLost || this.closed) return;
    lock.renewTimer?.clear();
    const delay = lock.expiresAt === null ? 0 : lock.expiresAt - (lock.lease * 2000) / 3 - monotonic();
    lock.renewTimer = later(() => {
      lock.renewTimer = null;
      this.renewLock(lock, lock.lease).catch(() => {}); // told through "lost"
    }, delay);
  }

  // -- release and renew -----------------------------------------------------

  /** @internal */
  async releaseLock(lock: Lock): Promise<void> {
    lock.stopKeepAlive();
    lock.expiryTimer?.clear();
    lock.expiryTimer = null;
    this.held.delete(lock);
    await this.releaseToken(lock.pool, lock.key, lock.token);
  }

  /**
   * Releases the grant `token` of `key` (a token obtained elsewhere): `R`,
   * retried every 200 ms for 5 s. Rejects with {@link StaleError} when that
   * token did not hold the key, {@link NoConnectionError} when unanswered.
   */
  release(key: string, token: string | bigint): Promise<void> {
    try {
      checkKey(key);
      return this.releaseToken(this.pool, key, checkToken(token));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** @internal */
  async releaseToken(pool: Pool, key: string, token: string): Promise<void> {
    if (this.closed) throw new NoConnectionError(`release of ${key} ${token} not sent: client closed`);
    let answer: Answered;
    try {
      answer = await new Retried(this, pool, "R", key, `R ${key} ${token}\n`, RETRY_EVERY_MS, monotonic() + RELEASE_RETRY_FOR_MS, () => true).start();
    } catch (error) {
      if (error instanceof LockServiceError) throw error;
      throw new NoConnectionError(`release of ${JSON.stringify(key)} (token ${token}) not confirmed within ${RELEASE_RETRY_FOR_MS / 1000} s: ${(error as Error).message}`);
    }
    if (answer.fields[2] !== "OK") throw new StaleError(`token ${token} does not hold ${JSON.stringify(key)} (already released or expired)`);
  }

  /** @internal */
  async renewLock(lock: Lock, lease: number): Promise<void> {
    checkLease(lease);
    if (lock.released) throw new StaleError(`${lock} was released; renewal not sent`);
    if (this.closed) throw new NoConnectionError("client closed");
    const now = monotonic();
    // Worth retrying while the client is still sure it holds the grant.
    const giveUpAt = Math.max(lock.expiresAt ?? now + RELEASE_RETRY_FOR_MS, now + RETRY_EVERY_MS);
    let answer: Answered;
    try {
      answer = await new Retried(
        this, lock.pool, "N", lock.key, `N ${lock.key} ${lock.token} ${formatSeconds(lease)}\n`, RETRY_EVERY_MS, giveUpAt,
        () => !lock.released && !this.closed,
      ).start();
    } catch (error) {
      if (error instanceof Abandoned) throw new StaleError(`${lock} was released; renewal abandoned`);
      if (error instanceof RejectedError) {
        lock.lastRenewError = error.message;
        lock.stopKeepAlive();
        if (lock.expiresAt === null) lock.markLost(`renewal ${error.message}`);
        throw error;
      }
      lock.lastRenewError = (error as Error).message;
      if (lock.expiresAt === null || lock.expiresAt <= monotonic() + 1) {
        lock.markLost(`the lease ran out on the client's clock while renewals failed (${lock.lastRenewError})`);
      }
      throw new NoConnectionError(`renewal of ${lock} not confirmed: ${lock.lastRenewError}`);
    }
    if (lock.released) return;
    if (answer.fields[2] === "OK") {
      lock.lastRenewError = null;
      this.confirmed(lock, answer.sentAt, lease);
      this.scheduleRenewal(lock);
      return;
    }
    lock.markLost(`renewal refused: token ${lock.token} no longer holds the key (STALE: expired, released or force-released)`);
    throw new StaleError(`token ${lock.token} no longer holds ${JSON.stringify(lock.key)}`);
  }

  /**
   * Renews the grant `token` of `key` (a token obtained elsewhere) for
   * `lease` seconds; retried for 5 s at most.
   */
  async renew(key: string, token: string | bigint, lease: number): Promise<void> {
    checkKey(key);
    const canonical = checkToken(token);
    checkLease(lease);
    if (this.closed) throw new NoConnectionError("client closed");
    let answer: Answered;
    try {
      answer = await new Retried(this, this.pool, "N", key, `N ${key} ${canonical} ${formatSeconds(lease)}\n`, RETRY_EVERY_MS, monotonic() + RELEASE_RETRY_FOR_MS, () => !this.closed).start();
    } catch (error) {
      if (error instanceof LockServiceError) throw error;
      throw new NoConnectionError(`renewal of ${JSON.stringify(key)} not confirmed: ${(error as Error).message}`);
    }
    if (answer.fields[2] !== "OK") throw new StaleError(`token ${canonical} does not hold ${JSON.stringify(key)}`);
  }

  // -- observe -----------------------------------------------------------------

  /**
   * One observation (`O key token wait`): resolves with the key's state as
   * soon as its newest grant is not `token` (`"?"`: at once), or when `wait`
   * seconds (0: no limit) ran out with nothing changed (`changed: false`).
   */
  observeOnce(key: string, token: string | bigint, wait: number, options: { signal?: AbortSignal } = {}): Promise<ObserveResult> {
    return this.observeOn(this.pool, key, token, wait, options.signal);
  }

  /** Who holds `key` now. */
  async holder(key: string, options: { signal?: AbortSignal } = {}): Promise<HolderState> {
    const { changed: _changed, ...state } = await this.observeOnce(key, "?", 0, options);
    return state;
  }

  /**
   * The holder of `key` now, then each change, as an async iterator
   * (`for await (const state of client.observe(key)) ...`). Survives
   * failovers (it re-observes from the last token seen); ends with
   * {@link CancelledError} when `signal` aborts.
   */
  async *observe(key: string, options: { signal?: AbortSignal } = {}): AsyncGenerator<HolderState, void, undefined> {
    checkKey(key);
    let last = "?";
    for (;;) {
      let result: ObserveResult;
      try {
        result = await this.observeOn(this.pool, key, last, 0, options.signal);
      } catch (error) {
        if (error instanceof NoConnectionError && !this.closed && !options.signal?.aborted) {
          await sleep(1000, options.signal).catch(() => {});
          continue;
        }
        throw error;
      }
      if (result.changed) {
        last = result.token;
        const { changed: _changed, ...state } = result;
        yield state;
      }
    }
  }

  private async observeOn(pool: Pool, key: string, token: string | bigint, wait: number, signal: AbortSignal | undefined): Promise<ObserveResult> {
    checkKey(key);
    const sentToken = token === "?" ? "?" : checkToken(token);
    checkWait(wait);
    if (this.closed) throw new NoConnectionError("client closed");
    const cancelled = (): CancelledError =>
      new CancelledError(`observe of ${JSON.stringify(key)} cancelled`, Promise.resolve(), { cause: signal?.reason });
    if (signal?.aborted) throw cancelled();
    const internal = new AbortController();
    const onAbort = (): void => internal.abort(cancelled());
    signal?.addEventListener("abort", onAbort, { once: true });
    const onClose = (e: Error): void => internal.abort(e);
    this.closers.add(onClose);
    try {
      return await this.observeLoop(pool, key, sentToken, wait, internal.signal);
    } catch (error) {
      if (internal.signal.aborted) throw internal.signal.reason;
      throw error;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      this.closers.delete(onClose);
    }
  }

  private async observeLoop(pool: Pool, key: string, sentToken: string, wait: number, signal: AbortSignal): Promise<ObserveResult> {
    const started = monotonic();
    const deadline = wait > 0 ? started + wait * 1000 : null;
    // With no connection up, wait for one this long: from the start, and
    // again from each drop (a long-pending request meeting a failover).
    let connectUntil = started + CONNECT_WAIT_MS;
    const tries = new Tries(pool.slots.length);
    let redirects = 0;
    let noActiveUntil: number | null = null;
    let prefer: Slot | null = null;
    let sends = 0;
    for (;;) {
      if (signal.aborted) throw signal.reason;
      const slot = await pool.claim("O", key, signal, prefer);
      prefer = null;
      if (slot === null) {
        await pool.whenUp(connectUntil, signal);
        continue;
      }
      const conn = slot.conn!;
      const now = monotonic();
      let waitText: string;
      let chunk: number;
      let last: boolean;
      if (sentToken === "?") {
        waitText = "0";
        chunk = 0;
        last = true;
      } else {
        const remaining = deadline === null ? Infinity : (deadline - now) / 1000;
        if (sends > 0 && remaining <= 0) {
          pool.unclaim(conn, "O", key);
          return { ...stateOf(["O", key, sentToken, "-"]), changed: false };
        }
        last = remaining <= OBSERVE_CHUNK_S;
        chunk = Math.max(0.001, Math.min(remaining, OBSERVE_CHUNK_S));
        waitText = sends === 0 && last ? formatSeconds(wait) : formatSeconds(chunk);
      }
      sends++;
      const request = conn.request("O", key, `O ${key} ${sentToken} ${waitText}\n`);
      // The connection's O of this key is free again when answered, whoever waits for it.
      request.then(
        () => pool.unclaim(conn, "O", key),
        () => pool.unclaim(conn, "O", key),
      );
      let fields: string[];
      try {
        fields = await bounded(request, chunk * 1000 + OBSERVE_GRACE_MS, signal);
      } catch (error) {
        if (signal.aborted) throw signal.reason;
        if (error instanceof NoAnswer) conn.suspect();
        else if (!(error instanceof ConnectionDropped)) throw error;
        connectUntil = Math.max(connectUntil, monotonic() + CONNECT_WAIT_MS);
        if (tries.failed(conn)) {
          throw new NoConnectionError(`no answer to the observe of ${JSON.stringify(key)} (${tries.used} tries): ${(error as Error).message}`);
        }
        await settleIO();
        continue;
      }
      switch (fields[0]) {
        case "O": {
          const state = stateOf(fields);
          const changed = sentToken === "?" || state.token !== sentToken;
          if (changed || last) return { ...state, changed };
          continue;
        }
        case "M": {
          const target = fields[3] ?? "*";
          if (target === "*") {
            if (noActiveUntil === null) noActiveUntil = deadline ?? monotonic() + NO_ACTIVE_FOR_MS;
            if (monotonic() >= noActiveUntil) throw new NoConnectionError("no active node (the cluster answers M *)");
            await sleep(NO_ACTIVE_RETRY_MS, signal);
            prefer = slot;
            continue;
          }
          redirects++;
          if (redirects > MAX_REDIRECTS) throw new NoConnectionError("too many redirects; no active node found");
          try {
            await slot.switchTo(target);
            prefer = slot;
            noActiveUntil = null;
          } catch {
            redirects--;
            if (noActiveUntil === null) noActiveUntil = deadline ?? monotonic() + NO_ACTIVE_FOR_MS;
            if (monotonic() >= noActiveUntil) throw new NoConnectionError(`the active node named by a redirect (${target}) cannot be reached`);
            await sleep(NO_ACTIVE_RETRY_MS, signal);
          }
          continue;
        }
        case "E":
          throw new RejectedError(fields.slice(3).join(" "));
        default:
          throw new NoConnectionError(`an unexpected answer: ${fields.join(" ")}`);
      }
    }
  }

  // -- elections -----------------------------------------------------------

  /**
   * Campaigns in `election` with `value` (an address, an id: a name's value,
   * no space or control character): acquires the election's key (wait 0,
   * keep-alive on) on a connection named `<value>#<instance id>`. Resolves
   * with the {@link Leadership} once this client leads.
   */
  async campaign(election: string, value: string, options: CampaignOptions = {}): Promise<Leadership> {
    checkKey(election, "election");
    const problem = campaignValueProblem(value);
    if (problem !== null) throw new InvalidError(`invalid campaign value ${JSON.stringify(value)}: ${problem}`);
    const lease = checkLease(options.lease ?? 10);
    if (this.closed) throw new NoConnectionError("client closed");
    const pool = this.campaignPool(value);
    let lock: Lock;
    try {
      lock = await this.acquireOn(pool, election, { lease, wait: 0, keepalive: true, signal: options.signal });
    } catch (error) {
      if (error instanceof CancelledError) {
        // The candidacy's connection stays open until the withdrawal is
        // answered and a grant that crossed it is released (its answer
        // comes on that connection), for a few seconds at most.
        void within(error.settled, CANCEL_SETTLE_MS).then(() => this.dropCampaignPool(value));
      } else {
        this.dropCampaignPool(value);
      }
      throw error;
    }
    let dropped = false;
    return new Leadership(election, value, lock, () => {
      if (dropped) return;
      dropped = true;
      this.dropCampaignPool(value);
    });
  }

  /** Who leads `election`: its value and token (`null`, `"0"` when nobody leads). */
  async leader(election: string, options: { signal?: AbortSignal } = {}): Promise<HolderState> {
    checkKey(election, "election");
    return this.holder(election, options);
  }

  private campaignPool(value: string): Pool {
    let entry = this.campaignPools.get(value);
    if (entry === undefined) {
      const pool = new Pool([...this.addresses], `${value}#${this.instance}`, this.tlsOptions);
      pool.start();
      entry = { pool, refs: 0 };
      this.campaignPools.set(value, entry);
    }
    entry.refs++;
    return entry.pool;
  }

  private dropCampaignPool(value: string): void {
    const entry = this.campaignPools.get(value);
    if (entry === undefined) return;
    entry.refs--;
    if (entry.refs <= 0) {
      this.campaignPools.delete(value);
      entry.pool.close();
    }
  }

  // -- misc ------------------------------------------------------------------

  /** Sends `P word` on the next connection; true when echoed. */
  async ping(word = "ping"): Promise<boolean> {
    checkKey(word, "word");
    const slot = this.pool.pick();
    if (slot === null || slot.conn === null) throw new NoConnectionError(`no connection: ${this.pool.lastError()}`);
    try {
      const fields = await bounded(slot.conn.request("P", word, `P ${word}\n`), 5000);
      return fields[0] === "P" && fields[1] === word;
    } catch (error) {
      throw new NoConnectionError(`ping failed: ${(error as Error).message}`);
    }
  }

  /**
   * Stops reconnecting and every keep-alive, fails what is pending with
   * {@link NoConnectionError}, and closes every connection. Held locks are
   * not released (their leases reclaim them): release them first.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const error = new NoConnectionError("client closed");
    for (const run of [...this.acquiring]) run.giveUp(error);
    for (const retried of [...this.retrying]) retried.finish(new GaveUp("client closed"));
    for (const closer of [...this.closers]) closer(error);
    for (const lock of [...this.held]) {
      lock.stopKeepAlive();
      lock.expiryTimer?.clear();
      lock.expiryTimer = null;
    }
    this.held.clear();
    const sockets = [this.pool, ...[...this.campaignPools.values()].map((e) => e.pool)].flatMap((pool) =>
      pool.slots.flatMap((s) => [s.conn, s.connecting]).filter((c): c is Connection => c !== null),
    );
    this.pool.close();
    for (const entry of this.campaignPools.values()) entry.pool.close();
    this.campaignPools.clear();
    await Promise.all(
      sockets.map((conn) => new Promise<void>((resolve) => {
        if (conn.socket.destroyed) resolve();
        else conn.socket.once("close", () => resolve());
      })),
    );
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

class NoAnswer extends Error {}

/** `promise` settled (either way), or `ms` passed. */
function within(promise: Promise<unknown>, ms: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = later(resolve, ms);
    const done = (): void => {
      timer.clear();
      resolve();
    };
    promise.then(done, done);
  });
}

/** `promise`, or a {@link NoAnswer} after `ms`, or the signal's reason when it aborts first. */
function bounded<T>(promise: Promise<T>, ms: number, signal?: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = later(() => finish(() => reject(new NoAnswer(`no answer within ${ms / 1000} s`))), ms);
    const onAbort = (): void => finish(() => reject(signal!.reason));
    let done = false;
    const finish = (f: () => void): void => {
      if (done) return;
      done = true;
      timer.clear();
      signal?.removeEventListener("abort", onAbort);
      f();
    };
    if (signal?.aborted) {
      finish(() => reject(signal.reason));
      return;
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (v) => finish(() => resolve(v)),
      (e) => finish(() => reject(e)),
    );
  });
}

/**
 * Starts a client for the nodes at `addrs` (`"host:port,host:port"` or an
 * array). Connections come up in the background (`await
 * client.whenConnected()` to wait for one); requests made before wait for
 * them.
 */
export function connect(addrs: string | readonly string[], options: ConnectOptions = {}): Client {
  return new Client(addrs, options);
}
