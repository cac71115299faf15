import Foundation
import Testing

@testable import LockboxAuth

/// The request deadline, and a process stopped past it while the answer arrived.
@Suite("Request deadline")
struct DeadlineTests {
    @Test("a timer woken well after the deadline (the process was stopped) gives an answer that arrived meanwhile its chance; a timer woken on time does not")
    func timerWokenLate_givesTheAnswerItsChance() async {
        // The answer arrives 1.6 s in; the deadline is 0.2 s.
        @Sendable func answer() async throws -> Int {
            try await Task.sleep(for: .milliseconds(1600))
            return 42
        }
        // The timer wakes 1.5 s in, as after a SIGSTOP of 1.3 s past the deadline.
        let late = await Deadline.run(.milliseconds(200), sleep: { _ in try await Task.sleep(for: .milliseconds(1500)) }, answer)
        if case .finished(.success(let value)) = late {
            #expect(value == 42)
        } else {
            Issue.record("the answer received while the process was stopped was thrown away: \(late)")
        }
        // An answer that never comes in time: the deadline holds, whether its timer woke on time
        // or late (a loaded machine wakes it late too, and then gives the request 2 s more).
        @Sendable func noAnswer() async throws -> Int {
            try await Task.sleep(for: .seconds(60))
            return 0
        }
        let start = ContinuousClock.now
        let onTime = await Deadline.run(.milliseconds(200), noAnswer)
        if case .expired = onTime {} else { Issue.record("the deadline did not hold: \(onTime)") }
        #expect(ContinuousClock.now - start < .seconds(30))
    }
}
