import Foundation
import Lockbox
import LockboxCore
import LockboxSSHAgent
import Synchronization
import Testing

/// A keychain that stays locked: every listing is refused.
private struct LockedKeys: AgentKeySource {
    func identities() throws(LockboxError) -> [AgentIdentity] {
        throw LockboxError.locked("Unlock it with `lockbox unlock`.")
    }
}

@Suite("SSH agent: its log")
struct AgentLogTests {
    @Test("a client asking a thousand times for what is refused writes one line per 10 s, then says how many it left out")
    func repeatedRefusals_areWrittenOncePerWindow() {
        let clock = ManualClock()
        let lines = Mutex<[String]>([])
        let responder = AgentResponder(
            keys: LockedKeys(), context: AuthenticationContext(interactionNotAllowed: true), log: { line in lines.withLock { $0.append(line) } },
            clock: clock)
        for _ in 0..<1000 {
            #expect(responder.reply(toBody: [AgentMessageType.requestIdentities]) == AgentReply.frame([5]))
        }
        #expect(lines.withLock { $0.count } == 1, "\(lines.withLock { $0 })")
        clock.advance(by: .seconds(11))
        _ = responder.reply(toBody: [AgentMessageType.requestIdentities])
        let written = lines.withLock { $0 }
        #expect(written.count == 2 && written[1].contains("999 more like it"), "\(written)")
        // Another kind of line is not held back by the first.
        _ = responder.reply(toBody: [17])
        #expect(lines.withLock { $0.count } == 3)
        // Refusals left out, then more distinct lines than are remembered: the count is still said.
        for _ in 0..<40 { _ = responder.reply(toBody: [AgentMessageType.requestIdentities]) }
        for type in 101...170 { _ = responder.reply(toBody: [UInt8(type)]) }
        #expect(lines.withLock { $0 }.contains { $0.contains("40 repeated lines were left out") }, "\(lines.withLock { $0.suffix(5) })")
    }
}
