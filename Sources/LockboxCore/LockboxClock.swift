import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Time as Lockbox's timeouts, delays and reuse windows see it, read and waited on through one
/// value so that a test moves time instead of sleeping (as NIO's `EmbeddedEventLoop` does).
package protocol LockboxClock: Sendable {
    /// Wall-clock time since 1970, for records that outlive the process (the failed-unlock
    /// delay, shared by every process through the vault file).
    func sinceEpoch() -> Duration
    /// A monotonic reading from an arbitrary origin, for idle timeouts and reuse windows.
    func uptime() -> Duration
    /// Blocks the calling thread for `duration` (nothing for zero or less).
    func sleep(for duration: Duration)
}

extension Duration {
    /// The duration in seconds, fractions included.
    package var secondsValue: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// Whole milliseconds, rounded up, clamped to `Int32` (what SQLite's busy timeout takes).
    package var wholeMilliseconds: Int32 {
        let (seconds, attoseconds) = components
        let milliseconds = seconds.multipliedReportingOverflow(by: 1000)
        guard !milliseconds.overflow else { return seconds > 0 ? .max : 0 }
        let rounded = milliseconds.partialValue + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: max(rounded, 0))
    }

    /// Whole seconds, rounded up, clamped to `UInt32` (what the kernel keyring takes).
    package var wholeSecondsRoundedUp: UInt32 {
        let (seconds, attoseconds) = components
        let rounded = seconds + (attoseconds > 0 ? 1 : 0)
        return UInt32(clamping: max(rounded, 0))
    }
}

/// The system's clocks: `CLOCK_REALTIME`, `CLOCK_MONOTONIC` and `nanosleep`.
package struct SystemClock: LockboxClock {
    package init() {}

    package func sinceEpoch() -> Duration { Self.read(CLOCK_REALTIME) }

    package func uptime() -> Duration { Self.read(CLOCK_MONOTONIC) }

    package func sleep(for duration: Duration) {
        guard duration > .zero else { return }
        let (seconds, attoseconds) = duration.components
        var interval = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
        var remaining = timespec()
        while nanosleep(&interval, &remaining) != 0 && errno == EINTR { interval = remaining }
    }

    private static func read(_ clock: clockid_t) -> Duration {
        var time = timespec()
        // Cannot fail for these two clocks and a valid pointer.
        clock_gettime(clock, &time)
        return .seconds(time.tv_sec) + .nanoseconds(time.tv_nsec)
    }
}

/// A clock that moves only when told to: `advance(by:)`, or a `sleep`, which returns at once
/// after moving the time forward and recording the wait. For tests.
package final class ManualClock: LockboxClock {
    private struct State {
        var elapsed: Duration = .zero
        var slept: [Duration] = []
    }

    private let origin: Duration
    private let state = Mutex(State())

    /// Starts at the system's wall-clock time (so records made with it make sense to other
    /// processes) and at an arbitrary monotonic reading.
    package init() {
        origin = SystemClock().sinceEpoch()
    }

    package func sinceEpoch() -> Duration { origin + state.withLock { $0.elapsed } }

    package func uptime() -> Duration { .seconds(1_000_000) + state.withLock { $0.elapsed } }

    package func sleep(for duration: Duration) {
        guard duration > .zero else { return }
        state.withLock {
            $0.elapsed += duration
            $0.slept.append(duration)
        }
    }

    /// Moves the time forward.
    package func advance(by duration: Duration) {
        state.withLock { $0.elapsed += duration }
    }

    /// Every wait a `sleep` was asked for, in order.
    package var sleeps: [Duration] { state.withLock { $0.slept } }
}
