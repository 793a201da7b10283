/**
 * Timers for delays of any length. Node's `setTimeout` holds at most
 * 2^31-1 ms (24.8 days) and fires a longer delay after 1 ms; waits and
 * leases given in seconds can be longer, so they are timed here in steps
 * below that limit.
 */

const monotonic = (): number => performance.now();

/** The longest delay one `setTimeout` holds. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** A pending call, cancelled with {@link Timer.clear}. */
export class Timer {
  private handle: NodeJS.Timeout | null = null;
  private referenced = true;
  private readonly due: number;

  constructor(private readonly fn: () => void, ms: number) {
    const delay = Number.isNaN(ms) ? 0 : Math.max(0, ms);
    // An infinite delay never comes: nothing is scheduled.
    this.due = monotonic() + delay;
    if (delay === Infinity) return;
    if (delay <= MAX_TIMER_MS) this.handle = setTimeout(() => this.fire(), delay);
    else this.arm();
  }

  /** Stops it; the call is not made. */
  clear(): void {
    if (this.handle !== null) clearTimeout(this.handle);
    this.handle = null;
  }

  /** Lets the process exit while it is pending. */
  unref(): this {
    this.referenced = false;
    this.handle?.unref();
    return this;
  }

  private arm(): void {
    const left = this.due - monotonic();
    if (left > MAX_TIMER_MS) this.handle = setTimeout(() => this.arm(), MAX_TIMER_MS);
    else this.handle = setTimeout(() => this.fire(), Math.max(0, left));
    if (!this.referenced) this.handle.unref();
  }

  private fire(): void {
    this.handle = null;
    this.fn();
  }
}

/** Calls `fn` after `ms` milliseconds, whatever their number (Infinity: never). */
export function later(fn: () => void, ms: number): Timer {
  return new Timer(fn, ms);
}

/** Clears `timer` when there is one; returns null (for `t = clear(t)`). */
export function clear(timer: Timer | null): null {
  timer?.clear();
  return null;
}
