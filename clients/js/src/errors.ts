/**
 * The client's errors. Every one is a {@link LockServiceError} with a `code`.
 */

export type ErrorCode = "timeout" | "stale" | "rejected" | "no_connection" | "invalid" | "cancelled" | "lost";

/** Base class of every error the client raises. */
export class LockServiceError extends Error {
  readonly code: ErrorCode;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** No grant within the wait (the server answered `T`, or a stalled node gave no answer in time). Nothing is held. */
export class TimeoutError extends LockServiceError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("timeout", message, options);
  }
}

/** The token does not hold the key (already released, expired, or force-released). Nothing changed. */
export class StaleError extends LockServiceError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("stale", message, options);
  }
}

/** The server answered `E`: a share that does not match the key's kind, a limit, a request it refused. */
export class RejectedError extends LockServiceError {
  /** The server's message. */
  readonly serverMessage: string;

  constructor(serverMessage: string, options?: { cause?: unknown }) {
    super("rejected", `rejected by the server: ${serverMessage}`, options);
    this.serverMessage = serverMessage;
  }
}

/** No connection could carry the request (none came up, each one tried dropped, no node answered in time). */
export class NoConnectionError extends LockServiceError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("no_connection", message, options);
  }
}

/** Refused before anything was sent: a bad key, lease, wait, share, token or campaign value. */
export class InvalidError extends LockServiceError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("invalid", message, options);
  }
}

/**
 * The caller's `AbortSignal` fired before the request completed.
 *
 * For an acquire or a campaign that had reached the server, the client
 * withdraws it (`C key`) at once and releases a grant that crossed the
 * withdrawal. `settled` resolves once that is done (never rejects).
 */
export class CancelledError extends LockServiceError {
  readonly settled: Promise<void>;

  constructor(message: string, settled: Promise<void> = Promise.resolve(), options?: { cause?: unknown }) {
    super("cancelled", message, options);
    this.settled = settled;
  }
}

/**
 * What a Lock's `lost` event carries: the holder can no longer be sure it
 * holds the lock (a renewal was refused, or the lease ran out while
 * renewals failed or were not made).
 */
export class LockLostError extends LockServiceError {
  readonly key: string;
  readonly token: string;
  readonly reason: string;

  constructor(key: string, token: string, reason: string) {
    super("lost", `lost the lock on ${JSON.stringify(key)} (token ${token}): ${reason}`);
    this.key = key;
    this.token = token;
    this.reason = reason;
  }
}

/** Internal: the connection carrying a request closed before its answer came. */
export class ConnectionDropped extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConnectionDropped";
  }
}
