import CredentialHelpers
import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
import SecretService
import Testing

/// The backends the helpers run on.
enum HelperBackend: String, CaseIterable, CustomTestStringConvertible {
    case vault
    case secretService = "secret-service"

    var testDescription: String { rawValue }
}

/// One keychain of a backend, as the helpers see it: the store in-process, and the
/// environment that makes the built helpers open the same one.
final class HelperKeychain {
    let store: any ItemStore
    let environment: [String: String?]
    private let fixture: VaultFixture?

    init(_ backend: HelperBackend, sourceLocation: SourceLocation = #_sourceLocation) throws {
        if backend == .vault {
            let made = try VaultFixture()
            fixture = made
            store = made.vault
            environment = ["LOCKBOX_BACKEND": nil, "LOCKBOX_KEYCHAIN": made.path]
        } else {
            fixture = nil
            store = try TestBus.store(sourceLocation: sourceLocation)
            environment = ["LOCKBOX_BACKEND": "secret-service"]
        }
    }

    var git: GitCredentialHelper { GitCredentialHelper(store: store) }
    var docker: DockerCredentialHelper { DockerCredentialHelper(store: store) }

    func git(_ operation: String, _ text: String) -> HelperOutcome {
        git.run(operation: operation, input: Array(text.utf8))
    }

    func dockerStore(_ url: String, _ username: String, _ secret: String) -> HelperOutcome {
        docker.run(
            operation: "store",
            input: FlatJSON.encodeObject([
                ("ServerURL", Array(url.utf8)), ("Username", Array(username.utf8)), ("Secret", Array(secret.utf8)),
            ]))
    }

    /// The secret docker's `get` answers for `url`, or nil when it finds none.
    func dockerSecret(_ url: String) throws -> String? {
        let outcome = docker.run(operation: "get", input: Array(url.utf8))
        if outcome.standardOutput == Array((DockerCredentialHelper.notFoundMessage + "\n").utf8) { return nil }
        let object = try FlatJSON.parseObject(outcome.standardOutput)
        return object["Secret"].map { String(decoding: $0, as: UTF8.self) }
    }

    /// Every internet password for `host`, in any group.
    func items(server host: String) throws -> [Item] {
        var query = Query(.internetPassword, attributes: .internet(server: host), limit: .all)
        query.returning = [.attributes, .data]
        let found: [Item]
        do throws(LockboxError) {
            found = try store.items(matching: query)
        } catch {
            guard error.code == .itemNotFound else { throw error }
            found = []
        }
        return found
    }

    /// An item as docker-credential-lockbox wrote it before docker's access group existed.
    func addLegacyDockerItem(_ url: String, host: String, username: String, secret: String) throws -> Data? {
        var attributes = ItemAttributes.internet(server: host, account: username, protocol: .https)
        attributes.comment = url
        attributes.itemDescription = DockerCredentialHelper.itemDescription
        attributes.label = "Docker credentials for \(url)"
        try store.add(Item(.internetPassword, attributes: attributes, data: SecretBytes(utf8: secret)))
        return try items(server: host).first { $0.attributes.comment == url }?.persistentReference
    }
}

/// git's and docker's helpers over one keychain: neither reads, overwrites nor erases the
/// other's credential for the same host, on either backend.
@Suite("git and docker credentials kept apart")
struct HelperSeparationTests {
    @Test("a docker login -> git never answers, overwrites or erases it", arguments: HelperBackend.allCases)
    func dockerLogin_isNeverAnsweredOverwrittenOrErasedByGit(backend: HelperBackend) throws {
        let keychain = try HelperKeychain(backend)
        let host = TestBus.unique("registry") + ".example"
        let url = "https://\(host)"
        let dockerSecret = TestBus.canary()
        #expect(keychain.dockerStore(url, "alice", dockerSecret).exitStatus == 0)

        for request in ["protocol=https\nhost=\(host)\n", "protocol=https\nhost=\(host)\nusername=alice\n"] {
            let answer = keychain.git("get", request)
            #expect(answer.exitStatus == 0)
            #expect(answer.standardOutput.isEmpty, "git answered with docker's credential")
        }

        // git stores its own credential under the same key...
        let gitSecret = TestBus.canary()
        let stored = keychain.git("store", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(gitSecret)\n")
        #expect(stored.exitStatus == 0, "\(stored.standardError)")
        #expect(try keychain.dockerSecret(url) == dockerSecret)
        #expect(String(decoding: keychain.git("get", "protocol=https\nhost=\(host)\n").standardOutput, as: UTF8.self)
            == "username=alice\npassword=\(gitSecret)\n")

        // ...and erases only that.
        #expect(keychain.git("erase", "protocol=https\nhost=\(host)\n").exitStatus == 0)
        #expect(keychain.git("get", "protocol=https\nhost=\(host)\n").standardOutput.isEmpty)
        #expect(try keychain.dockerSecret(url) == dockerSecret)
        #expect(try keychain.items(server: host).count == 1)
    }

    @Test("a git credential -> docker never answers, replaces or erases it", arguments: HelperBackend.allCases)
    func gitCredential_isNeverAnsweredReplacedOrErasedByDocker(backend: HelperBackend) throws {
        let keychain = try HelperKeychain(backend)
        let host = TestBus.unique("both") + ".example"
        let url = "https://\(host)"
        let gitSecret = TestBus.canary()
        #expect(keychain.git("store", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(gitSecret)\n").exitStatus == 0)
        #expect(try keychain.dockerSecret(url) == nil)
        #expect(String(decoding: keychain.docker.run(operation: "list", input: []).standardOutput, as: UTF8.self)
            .contains(host) == false)

        let dockerSecret = TestBus.canary()
        #expect(keychain.dockerStore(url, "alice", dockerSecret).exitStatus == 0)
        #expect(keychain.dockerStore(url, "alice", dockerSecret + "-2").exitStatus == 0)
        #expect(try keychain.dockerSecret(url) == dockerSecret + "-2")
        #expect(keychain.docker.run(operation: "erase", input: Array(url.utf8)).exitStatus == 0)
        #expect(String(decoding: keychain.git("get", "protocol=https\nhost=\(host)\n").standardOutput, as: UTF8.self)
            == "username=alice\npassword=\(gitSecret)\n")
    }

    @Test(
        "a docker item from before the access group -> moved in place on first sight, never git's",
        arguments: HelperBackend.allCases, ["git get", "git store", "docker get", "docker list"])
    func legacyDockerItem_isMovedInPlace_andNeverGits(backend: HelperBackend, firstSeenBy: String) throws {
        let keychain = try HelperKeychain(backend)
        let host = TestBus.unique("legacy") + ".example"
        let url = "https://\(host)"
        let legacySecret = TestBus.canary()
        let reference = try keychain.addLegacyDockerItem(url, host: host, username: "alice", secret: legacySecret)
        try #require(reference != nil)

        let gitSecret = TestBus.canary()
        if firstSeenBy == "git get" {
            let answer = keychain.git("get", "protocol=https\nhost=\(host)\n")
            #expect(answer.standardOutput.isEmpty)
        } else if firstSeenBy == "git store" {
            let stored = keychain.git("store", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(gitSecret)\n")
            #expect(stored.exitStatus == 0, "\(stored.standardError)")
        } else if firstSeenBy == "docker get" {
            let secret = try keychain.dockerSecret(url)
            #expect(secret == legacySecret)
        } else {
            let listed = keychain.docker.run(operation: "list", input: [])
            #expect(listed.exitStatus == 0)
        }

        // The same item (same reference, same value), now in docker's group.
        let dockers = try keychain.items(server: host).filter { $0.attributes.comment == url }
        #expect(dockers.count == 1)
        #expect(dockers.first?.persistentReference == reference)
        #expect(dockers.first?.attributes.accessGroup == DockerCredentialHelper.accessGroup)
        #expect(dockers.first?.data?.utf8String == legacySecret)
        #expect(try keychain.dockerSecret(url) == legacySecret)
        let answer = String(decoding: keychain.git("get", "protocol=https\nhost=\(host)\n").standardOutput, as: UTF8.self)
        #expect(answer == (firstSeenBy == "git store" ? "username=alice\npassword=\(gitSecret)\n" : ""))
    }

    @Test("a legacy docker item that cannot move -> kept, still not git's", arguments: HelperBackend.allCases)
    func legacyDockerItemThatCannotMove_isKept_andStillNotGits(backend: HelperBackend) throws {
        let keychain = try HelperKeychain(backend)
        let host = TestBus.unique("stuck") + ".example"
        let url = "https://\(host)"
        let legacySecret = TestBus.canary()
        _ = try keychain.addLegacyDockerItem(url, host: host, username: "alice", secret: legacySecret)
        // The same key already in docker's group: the move would be a duplicate.
        var current = ItemAttributes.internet(server: host, account: "alice", protocol: .https)
        current.comment = url
        current.itemDescription = DockerCredentialHelper.itemDescription
        current.accessGroup = DockerCredentialHelper.accessGroup
        let currentSecret = TestBus.canary()
        try keychain.store.add(Item(.internetPassword, attributes: current, data: SecretBytes(utf8: currentSecret)))

        #expect(keychain.git("get", "protocol=https\nhost=\(host)\n").standardOutput.isEmpty)
        #expect(try keychain.dockerSecret(url) == currentSecret)
        let list = try FlatJSON.parseObject(keychain.docker.run(operation: "list", input: []).standardOutput)
        #expect(list[url] == Array("alice".utf8))
        // Nothing was lost.
        #expect(Set(try keychain.items(server: host).map { $0.data?.utf8String }) == [legacySecret, currentSecret])
    }

    @Test("real git and the docker helper binary on one keychain -> neither crosses", arguments: HelperBackend.allCases)
    func realGitAndDockerBinary_onOneKeychain_neverCross(backend: HelperBackend) throws {
        let keychain = try HelperKeychain(backend)
        var git = try Git()
        git.overrides = keychain.environment
        let docker = try Paths.product("docker-credential-lockbox")
        var environment = helperEnvironment()
        for (name, value) in keychain.environment { environment[name] = value }
        let host = TestBus.unique("e2e") + ".example"
        let url = "https://\(host)"
        let dockerSecret = TestBus.canary()
        let login = try runProcess(
            docker, ["store"], input: Array(#"{"ServerURL":"\#(url)","Username":"alice","Secret":"\#(dockerSecret)"}"#.utf8),
            environment: environment)
        #expect(login.status == 0, "\(login.combined)")

        let fill = try git.credential("fill", "protocol=https\nhost=\(host)\n\n")
        #expect(fill.status != 0, "git fill must find nothing (and may not prompt)")
        #expect(!fill.combined.contains(dockerSecret))

        let gitSecret = TestBus.canary()
        #expect(try git.credential("approve", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(gitSecret)\n\n").status == 0)
        #expect(try git.credential("fill", "protocol=https\nhost=\(host)\n\n").stdout.contains("password=\(gitSecret)\n"))
        #expect(try git.credential("reject", "protocol=https\nhost=\(host)\nusername=alice\n\n").status == 0)

        let get = try runProcess(docker, ["get"], input: Array(url.utf8), environment: environment)
        #expect(get.status == 0, "\(get.combined)")
        #expect(get.stdout.contains(dockerSecret))
    }
}
