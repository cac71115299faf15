import LockboxCore
import VaultStorage

extension Vault {
    /// Makes this handle's storage operations fail on purpose, for the fault-injection
    /// campaign: the Nth statement or step from now fails, once or from then on. Nil stops.
    package func injectFaults(_ faults: StorageFaults?) {
        nonisolated(unsafe) let faults = faults
        withState { state in state.database.faults = faults }
    }
}
