/**
 * The connections to the nodes of one cluster, kept up in the background:
 * one per address, two when given a single address; used
 * round-robin; a connection that is down is skipped and redialled every 3 s.
 */

import type * as tls from "node:tls";

import { Connection, monotonic } from "./connection.js";
import { NoConnectionError } from "./errors.js";
import { later } from "./timer.js";
import { parseAddress, type Address } from "./wire.js";

/** Reconnection attempts are this far apart. */
export const RECONNECT_INTERVAL_MS = 3000;

type Kind = "A" | "O";

interface Claim {
  resolve: (slot: Slot | null) => void;
  reject: (e: unknown) => void;
  cleanup: () => void;
}

interface UpWaiter {
  since: number;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/** Waits `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      timer.clear();
      reject(signal!.reason);
    };
    const timer = later(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** One persistent connection of a pool: down, connecting, or up. */
export class Slot {
  readonly pool: Pool;
  readonly home: Address;
  /** Where it connects now: its home, or the active a redirect named. */
  address: Address;
  /** The ready connection, when up. */
  conn: Connection | null = null;
  connecting: Connection | null = null;
  /** A connection to a redirect's target, coming up. */
  private switching: { address: Address; conn: Connection } | null = null;
  lastError: string | null = null;
  lastAttemptAt = -Infinity;
  lastFailureAt = -Infinity;
  private retryTimer: NodeJS.Timeout | null = null;
  private switchWaiters: Array<{ resolve: () => void; reject: (e: unknown) => void }> = [];

  constructor(pool: Pool, home: Address) {
    this.pool = pool;
    this.home = home;
    this.address = home;
  }

  get up(): boolean {
    return this.conn !== null;
  }

  connect(): void {
    if (this.pool.closed || this.connecting !== null || this.conn !== null) return;
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.lastAttemptAt = monotonic();
    const address = this.address;
    const conn = new Connection(address, this.pool.name, this.pool.tls);
    this.connecting = conn;
    conn.onClose = () => this.lost(conn);
    conn.ready.then(
      () => this.connected(conn),
      (err: unknown) => this.failed(conn, address, err),
    );
  }

  private connected(conn: Connection): void {
    if (this.connecting !== conn) return;
    this.connecting = null;
    if (this.pool.closed) {
      conn.end();
      return;
    }
    this.conn = conn;
    this.lastError = null;
    const waiters = this.switchWaiters;
    this.switchWaiters = [];
    for (const w of waiters) w.resolve();
    this.pool.slotUp(this);
  }

  private failed(conn: Connection, address: Address, err: unknown): void {
    if (this.connecting !== conn) return;
    this.connecting = null;
    this.lastError = err instanceof Error ? err.message : String(err);
    this.lastFailureAt = monotonic();
    // A redirect target that cannot be reached: back home next time.
    this.address = this.home;
    const waiters = this.switchWaiters;
    this.switchWaiters = [];
    for (const w of waiters) w.reject(new NoConnectionError(`cannot connect to ${address.text}: ${this.lastError}`));
    if (!this.pool.closed) {
      this.scheduleRetry(RECONNECT_INTERVAL_MS);
      this.pool.attemptFailed();
    }
  }

  private lost(conn: Connection): void {
    if (this.conn !== conn) return; // an attempt that failed: see failed()
    this.conn = null;
    this.lastError = `${conn.address.text}: ${conn.closeReason}`;
    if (this.pool.closed) return;
    // A redirected connection that is lost goes back to its own address,
    // which redirects it to whoever is active by then. Redial at once,
    // but never sooner than 3 s after the previous attempt.
    this.address = this.home;
    this.scheduleRetry(Math.max(0, this.lastAttemptAt + RECONNECT_INTERVAL_MS - monotonic()));
    this.pool.slotDown(this);
  }

  private scheduleRetry(delay: number): void {
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.connect();
    }, delay);
  }

  /**
   * Follows a redirect: connects this slot to `target`, and once that
   * connection is up, retires the old one (closed once its pending answers
   * are in). Make before break: when `target` cannot be reached, the slot
   * keeps the connection it had. Resolves when connected there; rejects
   * with {@link NoConnectionError}.
   */
  switchTo(target: string): Promise<void> {
    let address: Address;
    try {
      address = parseAddress(target);
    } catch {
      return Promise.reject(new NoConnectionError(`redirected to a bad address ${JSON.stringify(target)}`));
    }
    if (this.pool.closed) return Promise.reject(new NoConnectionError("client closed"));
    if (this.conn !== null && this.address.text === address.text) return Promise.resolve();
    const promise = new Promise<void>((resolve, reject) => this.switchWaiters.push({ resolve, reject }));
    if (this.switching !== null && this.switching.address.text === address.text) return promise;
    if (this.switching !== null) this.switching.conn.destroy("redirected elsewhere");
    const conn = new Connection(address, this.pool.name, this.pool.tls);
    const switching = { address, conn };
    this.switching = switching;
    conn.ready.then(
      () => {
        if (this.switching !== switching) {
          conn.end();
          return;
        }
        this.switching = null;
        if (this.pool.closed) {
          conn.end();
          return;
        }
        if (this.retryTimer !== null) clearTimeout(this.retryTimer);
        this.retryTimer = null;
        if (this.connecting !== null) {
          this.connecting.onClose = null;
          this.connecting.destroy("redirected elsewhere");
          this.connecting = null;
        }
        const old = this.conn;
        this.conn = conn;
        this.address = address;
        this.lastError = null;
        conn.onClose = () => this.lost(conn);
        if (old !== null) {
          old.onClose = null;
          old.retire();
        }
        const waiters = this.switchWaiters;
        this.switchWaiters = [];
        for (const w of waiters) w.resolve();
        this.pool.slotUp(this);
      },
      (error: unknown) => {
        if (this.switching !== switching) return;
        this.switching = null;
        const why = error instanceof Error ? error.message : String(error);
        const waiters = this.switchWaiters;
        this.switchWaiters = [];
        for (const w of waiters) w.reject(new NoConnectionError(`cannot connect to ${address.text} (redirected there): ${why}`));
      },
    );
    return promise;
  }

  close(): void {
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const waiters = this.switchWaiters;
    this.switchWaiters = [];
    for (const w of waiters) w.reject(new NoConnectionError("client closed"));
    if (this.switching !== null) this.switching.conn.destroy("client closed");
    this.switching = null;
    for (const conn of [this.conn, this.connecting]) {
      if (conn !== null) {
        conn.onClose = null;
        conn.end();
      }
    }
    this.conn = null;
    this.connecting = null;
  }
}

/** The connections to the nodes of one cluster. */
export class Pool {
  readonly homes: Address[];
  readonly slots: Slot[];
  readonly name: string;
  readonly tls: tls.ConnectionOptions | null;
  closed = false;
  private next = 0;
  private readonly claims = new Map<string, Claim[]>();
  private readonly upWaiters = new Set<UpWaiter>();

  constructor(homes: Address[], name: string, tlsOptions: tls.ConnectionOptions | null) {
    if (homes.length === 0) throw new Error("a cluster needs at least one address");
    this.homes = homes;
    this.name = name;
    this.tls = tlsOptions;
    const slotHomes = homes.length === 1 ? [homes[0]!, homes[0]!] : homes;
    this.slots = slotHomes.map((home) => new Slot(this, home));
  }

  start(): void {
    for (const slot of this.slots) slot.connect();
  }

  get up(): boolean {
    return this.slots.some((s) => s.up);
  }

  lastError(): string {
    const errors = this.slots.map((s) => s.lastError).filter((e): e is string => e !== null);
    return errors.length > 0 ? errors[errors.length - 1]! : "not connected yet";
  }

  /** The next connected slot, round-robin, that `accept` takes; null when none. */
  pick(accept?: (conn: Connection) => boolean): Slot | null {
    const count = this.slots.length;
    for (let i = 0; i < count; i++) {
      const index = (this.next + i) % count;
      const slot = this.slots[index]!;
      if (slot.conn !== null && !slot.conn.retiring && (accept === undefined || accept(slot.conn))) {
        this.next = (index + 1) % count;
        return slot;
      }
    }
    return null;
  }

  /**
   * A connected slot with no outstanding `kind` request of `key`, marked as
   * having one now (at most one outstanding `A` and one `O` per key
   * per connection). Waits its turn (FIFO) while every connection has one.
   * Resolves null when no connection is up at all.
   */
  claim(kind: Kind, key: string, signal: AbortSignal, prefer: Slot | null = null): Promise<Slot | null> {
    const now = this.claimNow(kind, key, prefer);
    if (now !== undefined) return Promise.resolve(now);
    return this.claimLater(kind, key, signal);
  }

  /**
   * {@link claim} without waiting: the slot, null when no connection is up,
   * undefined when it would have to wait its turn.
   */
  claimNow(kind: Kind, key: string, prefer: Slot | null = null): Slot | null | undefined {
    const queue = this.claims.get(`${kind} ${key}`);
    if (queue !== undefined && queue.length > 0) return undefined;
    if (!this.up) return null;
    if (prefer !== null && prefer.conn !== null && !prefer.conn.retiring) {
      const marks = kind === "A" ? prefer.conn.outstandingA : prefer.conn.outstandingO;
      if (!marks.has(key)) {
        marks.add(key);
        return prefer;
      }
    }
    const slot = this.pickFree(kind, key);
    return slot === null ? undefined : slot;
  }

  /** Waits its turn for a slot (see {@link claim}). */
  claimLater(kind: Kind, key: string, signal: AbortSignal): Promise<Slot | null> {
    const queueKey = `${kind} ${key}`;
    return new Promise<Slot | null>((resolve, reject) => {
      if (signal.aborted) {
        reject(signal.reason);
        return;
      }
      const onAbort = (): void => {
        const q = this.claims.get(queueKey);
        if (q) {
          const at = q.indexOf(claim);
          if (at >= 0) q.splice(at, 1);
          if (q.length === 0) this.claims.delete(queueKey);
        }
        reject(signal.reason);
      };
      const claim: Claim = {
        resolve: (slot) => {
          signal.removeEventListener("abort", onAbort);
          resolve(slot);
        },
        reject,
        cleanup: () => signal.removeEventListener("abort", onAbort),
      };
      signal.addEventListener("abort", onAbort, { once: true });
      const q = this.claims.get(queueKey);
      if (q) q.push(claim);
      else this.claims.set(queueKey, [claim]);
    });
  }

  private pickFree(kind: Kind, key: string): Slot | null {
    const slot = this.pick((conn) => !(kind === "A" ? conn.outstandingA : conn.outstandingO).has(key));
    if (slot !== null) (kind === "A" ? slot.conn!.outstandingA : slot.conn!.outstandingO).add(key);
    return slot;
  }

  /** The outstanding `kind` request of `key` on `conn` is answered (or gone). */
  unclaim(conn: Connection, kind: Kind, key: string): void {
    (kind === "A" ? conn.outstandingA : conn.outstandingO).delete(key);
    if (conn.retiring && conn.inFlight === 0) conn.end();
    this.dispatch(`${kind} ${key}`);
  }

  private dispatch(queueKey: string): void {
    const queue = this.claims.get(queueKey);
    if (!queue) return;
    const space = queueKey.indexOf(" ");
    const kind = queueKey.slice(0, space) as Kind;
    const key = queueKey.slice(space + 1);
    while (queue.length > 0) {
      if (!this.up) {
        // Nothing is up: each waiter goes back to waiting for a connection.
        for (const c of queue.splice(0)) c.resolve(null);
        break;
      }
      const slot = this.pickFree(kind, key);
      if (slot === null) break;
      queue.shift()!.resolve(slot);
    }
    if (queue.length === 0) this.claims.delete(queueKey);
  }

  slotUp(_slot: Slot): void {
    const waiters = [...this.upWaiters];
    this.upWaiters.clear();
    for (const w of waiters) w.resolve();
    for (const queueKey of [...this.claims.keys()]) this.dispatch(queueKey);
  }

  slotDown(_slot: Slot): void {
    if (!this.up) for (const queueKey of [...this.claims.keys()]) this.dispatch(queueKey);
  }

  attemptFailed(): void {
    if (this.upWaiters.size === 0) return;
    for (const w of [...this.upWaiters]) {
      // Every address was tried (an attempt that ended after this wait began) and failed.
      if (this.slots.every((s) => !s.up && s.connecting === null && s.lastFailureAt >= w.since)) {
        this.upWaiters.delete(w);
        w.reject(new NoConnectionError(`cannot connect: ${this.lastError()}`));
      }
    }
  }

  /**
   * Resolves once a connection is up. Every connection that is down is
   * tried at once; rejects with {@link NoConnectionError} when each attempt
   * failed, at `until` (monotonic ms), or when `signal` aborts (its reason).
   */
  whenUp(until: number, signal?: AbortSignal): Promise<void> {
    if (this.up) return Promise.resolve();
    if (this.closed) return Promise.reject(new NoConnectionError("client closed"));
    return new Promise<void>((resolve, reject) => {
      const waiter: UpWaiter = {
        since: monotonic(),
        resolve: () => settle(() => resolve()),
        reject: (e) => settle(() => reject(e)),
      };
      const timer = later(() => {
        this.upWaiters.delete(waiter);
        settle(() => reject(new NoConnectionError(`no connection to ${this.homes.map((h) => h.text).join(", ")} in time (last error: ${this.lastError()})`)));
      }, until - monotonic());
      const onAbort = (): void => {
        this.upWaiters.delete(waiter);
        settle(() => reject(signal!.reason));
      };
      const settle = (f: () => void): void => {
        timer.clear();
        signal?.removeEventListener("abort", onAbort);
        f();
      };
      if (signal?.aborted) {
        settle(() => reject(signal.reason));
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      this.upWaiters.add(waiter);
      for (const slot of this.slots) slot.connect();
      this.attemptFailed();
    });
  }

  close(): void {
    this.closed = true;
    for (const slot of this.slots) slot.close();
    for (const w of [...this.upWaiters]) w.reject(new NoConnectionError("client closed"));
    this.upWaiters.clear();
    for (const queue of this.claims.values()) for (const c of queue) {
      c.cleanup();
      c.reject(new NoConnectionError("client closed"));
    }
    this.claims.clear();
  }
}
