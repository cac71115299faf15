// docker-credential-lockbox: docker's credential helper protocol over the Lockbox keychain.
//   ~/.docker/config.json: { "credsStore": "lockbox" }
import CredentialHelpers
import Lockbox
import LockboxCore

/// The keychain Keychain.open() chooses: the vault by default, the desktop keyring with
/// LOCKBOX_BACKEND=secret-service.
func openStore() -> any ItemStore {
    do {
        return try Keychain.open().store
    } catch {
        HelperProcess.finish(HelperOutcome(standardOutput: Array("\(error)\n".utf8), exitStatus: 1))
    }
}

// A standard descriptor left closed is taken by no file or socket opened below.
HelperProcess.reserveStandardDescriptors()
// Before this process hides its /proc files: the broker, when one is used, identifies it now.
Keychain.prepareBroker()
guard HelperProcess.hardenProcess() else {
    HelperProcess.finish(
        HelperOutcome(
            standardOutput: Array(
                "could not make this process non-dumpable (prctl PR_SET_DUMPABLE); refusing to handle credentials\n".utf8),
            exitStatus: 1))
}
// A path read from the environment with bytes that are not UTF-8 would name another keychain.
if let variable = ProcessEnvironment.firstVariableNotUTF8() {
    HelperProcess.finish(
        HelperOutcome(
            standardOutput: Array("the environment variable \(variable) is not UTF-8 text (not shown); set it to UTF-8 text\n".utf8),
            exitStatus: 1))
}
let arguments = CommandLine.arguments
guard arguments.count == 2 else {
    HelperProcess.finish(
        HelperOutcome(
            standardOutput: Array("Usage: docker-credential-lockbox <store|get|erase|list|version>\n".utf8),
            exitStatus: 1))
}
let operation = arguments[1]
if operation == "version" {
    HelperProcess.finish(
        HelperOutcome(standardOutput: Array("docker-credential-lockbox (lockbox) \(DockerCredentialHelper.version)\n".utf8)))
}
// list and version take no input; docker leaves stdin attached to the caller for them.
var input = ["store", "get", "erase"].contains(operation) ? HelperProcess.readStandardInput(limit: DockerCredentialHelper.maximumInputSize) : []
let helper = DockerCredentialHelper(store: openStore())
let outcome = helper.run(operation: operation, input: input)
input.wipe()
HelperProcess.finish(outcome)
