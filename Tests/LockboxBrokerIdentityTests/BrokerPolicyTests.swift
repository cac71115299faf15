import LockboxBrokerIdentity
import LockboxCore
import LockboxTestSupport
import Testing

@Suite struct BrokerPolicyTests {
    @Test func identityWithoutEntry_getsAGroupOfItsOwn() {
        let identity = PeerIdentity(uid: 0, pid: 1, kind: .executable(path: "/usr/bin/app"), executablePath: "/usr/bin/app", executableSHA256: nil, startTime: 1)
        #expect(BrokerPolicy().grant(for: identity).accessGroups == ["exe:/usr/bin/app"])
    }
}
