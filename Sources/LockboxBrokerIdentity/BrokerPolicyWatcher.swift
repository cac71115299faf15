import LockboxCore
import Synchronization

/// The broker's policy, read again whenever the file or its directory changes.
///
/// Each `current()` compares the directory's and the file's identity (device, inode, mode,
/// owner, size, modification and change times) with those of the last read: an atomic replace
/// (a new inode) and an edit in place are both seen, and the new file goes through every check
/// of `BrokerPolicy.load`. A file that has become unsafe or malformed is an error, never the
/// last good policy: a person who removed a grant expects it gone.
public final class BrokerPolicyWatcher: Sendable {
    /// The policy's directory.
    public let directory: String
    private let state = Mutex<(policy: BrokerPolicy, version: PolicyFile.Version?)?>(nil)

    /// A watcher of the policy in `directory`; nothing is read until `current()`.
    public init(directory: String = BrokerPolicy.defaultDirectory) {
        self.directory = directory
    }

    /// The policy as the file says now.
    /// - Throws: what `BrokerPolicy.load` throws.
    public func current() throws(LockboxError) -> BrokerPolicy {
        let onDisk = PolicyFile.currentVersion(directory: directory)
        if let onDisk, let cached = state.withLock({ $0 }), cached.version == onDisk {
            return cached.policy
        }
        // Read outside the lock: a slow disk does not hold up the callers that have the answer.
        let fresh = try PolicyFile.read(directory: directory)
        state.withLock { $0 = fresh.version == nil ? nil : fresh }
        return fresh.policy
    }
}
