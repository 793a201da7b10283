/**
 * A granted lock (and a leadership, which is a lock on an election's key).
 */

import { EventEmitter } from "node:events";

import { monotonic } from "./connection.js";
import { LockLostError, StaleError } from "./errors.js";
import type { Pool } from "./pool.js";
import type { Timer } from "./timer.js";

/** What a {@link Lock} needs from its client. */
export interface LockOwner {
  releaseLock(lock: Lock): Promise<void>;
  renewLock(lock: Lock, lease: number): Promise<void>;
  scheduleRenewal(lock: Lock): void;
  forgetLock(lock: Lock): void;
}

export interface Lock {
  /** `lost`: the holder can no longer be sure it holds the lock; stop working under it. */
  on(event: "lost", listener: (error: LockLostError) => void): this;
  once(event: "lost", listener: (error: LockLostError) => void): this;
  off(event: "lost", listener: (error: LockLostError) => void): this;
  addListener(event: "lost", listener: (error: LockLostError) => void): this;
  removeListener(event: "lost", listener: (error: LockLostError) => void): this;
  emit(event: "lost", error: LockLostError): boolean;
}

/**
 * A granted lock: its `key` and fencing `token`.
 *
 * - `token` is the decimal string the server sent (a u64: it does not fit a
 *   JavaScript number); `tokenBigInt` is the same as a `bigint`.
 * - `release()` gives it back (retried for 5 s across connections);
 *   `await using lock = await client.acquire(...)` releases it at the end of
 *   the block where `await using` is supported.
 * - `renew(lease)` extends it; `keepAlive: true` (or `startKeepAlive()`)
 *   renews it every third of the lease.
 * - The `lost` event (and `signal`, an AbortSignal aborted with the same
 *   {@link LockLostError}) tells the moment the client can no longer be sure
 *   it holds the lock: a renewal was refused (`STALE`), or the lease ran out
 *   on the client's clock (while renewals failed, or without any).
 */
export class Lock extends EventEmitter {
  readonly key: string;
  readonly token: string;
  /** The lease asked for, in seconds (renewals without a lease use it). */
  readonly lease: number;
  /** `null` exclusive, `"r"` a read lock, n the slots of a semaphore. */
  readonly share: null | "r" | number;
  /** @internal */
  readonly pool: Pool;
  /** @internal until when (monotonic ms) the client is sure the server holds the grant; null when unknown. */
  expiresAt: number | null = null;
  /** @internal */
  keepAliveOn = false;
  /** @internal */
  renewTimer: Timer | null = null;
  /** @internal */
  expiryTimer: Timer | null = null;
  /** @internal */
  lastRenewError: string | null = null;
  private released_ = false;
  private lostError_: LockLostError | null = null;
  private controller: AbortController | null = null;
  private releasing: Promise<void> | null = null;
  private readonly owner: LockOwner;

  /** @internal */
  constructor(owner: LockOwner, pool: Pool, key: string, token: string, lease: number, share: null | "r" | number) {
    super();
    this.owner = owner;
    this.pool = pool;
    this.key = key;
    this.token = token;
    this.lease = lease;
    this.share = share;
  }

  /** The token as a bigint (tokens are u64). */
  get tokenBigInt(): bigint {
    return BigInt(this.token);
  }

  /** True once `release()` was called. */
  get released(): boolean {
    return this.released_;
  }

  /** True once the lock was reported lost. */
  get isLost(): boolean {
    return this.lostError_ !== null;
  }

  /** The error the `lost` event carried, or null. */
  get lostError(): LockLostError | null {
    return this.lostError_;
  }

  /** Whether keep-alive renews this lock. */
  get keepAlive(): boolean {
    return this.keepAliveOn;
  }

  /**
   * Seconds for which the client is sure the server still holds this grant
   * (counted from when the acquire or the last confirmed renewal was sent);
   * 0 when it is not sure.
   */
  get validFor(): number {
    if (this.expiresAt === null || this.released_ || this.isLost) return 0;
    return Math.max(0, (this.expiresAt - monotonic()) / 1000);
  }

  /** Aborted (with the {@link LockLostError}) when the lock is lost: hand it to the work done under the lock. */
  get signal(): AbortSignal {
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.lostError_ !== null) this.controller.abort(this.lostError_);
    }
    return this.controller.signal;
  }

  /**
   * Releases the lock: `R key token`, sent at once and again every 200 ms
   * (on another connection, across drops and redirects) until answered,
   * for 5 s at most. Keep-alive stops first. Calling it again returns the
   * same promise.
   *
   * Rejects with {@link StaleError} when the token no longer held the key
   * (it had expired or been force-released), {@link NoConnectionError}
   * when no node answered within the 5 s.
   */
  release(): Promise<void> {
    if (this.releasing === null) {
      this.released_ = true;
      this.releasing = this.owner.releaseLock(this);
    }
    return this.releasing;
  }

  /**
   * Renews the lock now: its lease runs `lease` seconds (default: the
   * acquire's) from when the node receives it. Retried every 200 ms until
   * answered or until the current lease runs out.
   *
   * Rejects with {@link StaleError} (and the lock is lost),
   * {@link RejectedError}, or {@link NoConnectionError}.
   */
  renew(lease?: number): Promise<void> {
    return this.owner.renewLock(this, lease ?? this.lease);
  }

  /** Renews automatically every third of the lease until released or lost. */
  startKeepAlive(): void {
    if (this.released_ || this.isLost || this.keepAliveOn) return;
    this.keepAliveOn = true;
    this.owner.scheduleRenewal(this);
  }

  /** Stops renewing automatically. */
  stopKeepAlive(): void {
    this.keepAliveOn = false;
    this.renewTimer?.clear();
    this.renewTimer = null;
  }

  /** @internal marks the lock lost and tells its listeners once. */
  markLost(reason: string): void {
    this.stopKeepAlive();
    this.expiryTimer?.clear();
    this.expiryTimer = null;
    this.owner.forgetLock(this);
    if (this.lostError_ !== null || this.released_) return;
    const error = new LockLostError(this.key, this.token, reason);
    this.lostError_ = error;
    this.controller?.abort(error);
    this.emit("lost", error);
  }

  /** `await using lock = await client.acquire(...)`: released at the end of the block. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  override toString(): string {
    return `Lock(${JSON.stringify(this.key)}, ${this.token})`;
  }
}

export interface Leadership {
  /** `lost`: the leadership's lease ran out or a renewal was refused; stop acting as leader. */
  on(event: "lost", listener: (error: LockLostError) => void): this;
  once(event: "lost", listener: (error: LockLostError) => void): this;
  off(event: "lost", listener: (error: LockLostError) => void): this;
  addListener(event: "lost", listener: (error: LockLostError) => void): this;
  removeListener(event: "lost", listener: (error: LockLostError) => void): this;
  emit(event: "lost", error: LockLostError): boolean;
}

/**
 * This client leads an election: it holds the election's key (kept alive),
 * on a connection named after `value`. `token` fences what it does as
 * leader. `resign()` (or `await using`) gives the leadership up.
 */
export class Leadership extends EventEmitter {
  readonly election: string;
  readonly value: string;
  /** The lock on the election's key. */
  readonly lock: Lock;
  private readonly onResign: () => void;
  private resigning: Promise<void> | null = null;

  /** @internal */
  constructor(election: string, value: string, lock: Lock, onResign: () => void) {
    super();
    this.election = election;
    this.value = value;
    this.lock = lock;
    this.onResign = onResign;
    lock.on("lost", (error) => {
      this.onResign();
      this.emit("lost", error);
    });
  }

  get token(): string {
    return this.lock.token;
  }

  get tokenBigInt(): bigint {
    return this.lock.tokenBigInt;
  }

  get isLost(): boolean {
    return this.lock.isLost;
  }

  /** Aborted when the leadership is lost. */
  get signal(): AbortSignal {
    return this.lock.signal;
  }

  /**
   * Gives the leadership up (releases the election's key). Resolves also
   * when the leadership was already lost; rejects with
   * {@link NoConnectionError} when no node answered within 5 s.
   */
  resign(): Promise<void> {
    if (this.resigning === null) {
      // A leadership already lost (its grant gone: STALE) is resigned all the same.
      this.resigning = this.lock
        .release()
        .catch((error: unknown) => {
          if (!(error instanceof StaleError)) throw error;
        })
        .finally(() => this.onResign());
    }
    return this.resigning;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.resign();
  }
}
