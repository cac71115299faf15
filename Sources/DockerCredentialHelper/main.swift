// docker-credential-lockbox: docker's credential helper protocol over the Lockbox keychain.
//   ~/.docker/config.json: { "credsStore": "lockbox" }
import CredentialHelpers
import LockboxCore
import SecretService

HelperProcess.hardenProcess()
let arguments = CommandLine.arguments
guard arguments.count == 2 else {
    HelperProcess.finish(
        HelperOutcome(
            standardOutput: Array("Usage: docker-credential-lockbox <store|get|erase|list|version>\n".utf8),
            exitStatus: 1))
}
let operation = arguments[1]
// list and version take no input; docker leaves stdin attached to the caller for them.
var input = ["store", "get", "erase"].contains(operation) ? HelperProcess.readStandardInput() : []
let helper = DockerCredentialHelper(store: SecretServiceStore())
let outcome = helper.run(operation: operation, input: input)
input.wipe()
HelperProcess.finish(outcome)
