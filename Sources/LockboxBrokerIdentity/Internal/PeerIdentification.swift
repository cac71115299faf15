import LockboxCore

/// The steps of `PeerIdentity.identify`, with a hook between the first start-time read and
/// the last, so that a test can make the process exit in the middle.
struct PeerIdentification {
    let socket: Int32
    let hashExecutable: Bool
    let between: (() -> Void)?

    init(socket: Int32, hashExecutable: Bool, between: (() -> Void)?) {
        self.socket = socket
        self.hashExecutable = hashExecutable
        self.between = between
    }

    func run() throws(LockboxError) -> PeerIdentity {
        throw LockboxError(.unimplemented, "Peer identification is not built yet.")
    }
}
