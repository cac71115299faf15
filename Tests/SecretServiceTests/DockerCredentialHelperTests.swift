import CredentialHelpers
import Foundation
import LockboxCore
import SecretService
import Testing

/// The flat JSON docker's credential protocol uses, as pure functions.
@Suite("docker credential protocol: JSON")
struct FlatJSONTests {
    @Test func parse_escapesAndUnicode_decodeToBytes() throws {
        let object = try FlatJSON.parseObject(
            Array(#" {"ServerURL": "https://r.example/v1/", "Secret":"a\"b\\c\u00e9\ud83d\ude00\n<&>", "Username":"\u0061lice"} "#.utf8))
        #expect(object["ServerURL"].map { String(decoding: $0, as: UTF8.self) } == "https://r.example/v1/")
        #expect(object["Secret"].map { String(decoding: $0, as: UTF8.self) } == "a\"b\\cé😀\n<&>")
        #expect(object["Username"].map { String(decoding: $0, as: UTF8.self) } == "alice")
    }

    @Test(arguments: [#"{"a":1}"#, #"{"a":"b""#, #"{"a":"\x"}"#, #"{"a":"\ud800"}"#, "", #"{"a":"b"} x"#, "[]"])
    func parse_malformedInput_throws(_ text: String) {
        #expect(throws: FlatJSON.ParseError.self) { try FlatJSON.parseObject(Array(text.utf8)) }
    }

    @Test func encode_thenParse_roundTripsEveryByte() throws {
        let awkward: [UInt8] = Array("quote\" backslash\\ newline\n tab\t bell\u{07} é".utf8)
        let encoded = FlatJSON.encodeObject([("Secret", awkward), ("Username", Array("alice".utf8))])
        #expect(try FlatJSON.parseObject(encoded)["Secret"] == awkward)
        #expect(String(decoding: encoded, as: UTF8.self).hasPrefix(#"{"Secret":"quote\" backslash\\ newline\n"#))
    }
}

/// docker-credential-lockbox driven by the Python `docker` package's credential store client
/// (docker.credentials.Store), which runs `docker-credential-<name>` from PATH as docker does.
@Suite("docker credential helper against gnome-keyring")
struct DockerCredentialHelperTests {
    private static let client = #"""
        import json, sys
        from docker import credentials
        store = credentials.Store(sys.argv[1])
        command, url = sys.argv[2], sys.argv[3]
        try:
            if command == 'store':
                store.store(url, sys.argv[4], sys.stdin.read())
                print('stored')
            elif command == 'get':
                print(json.dumps(store.get(url)))
            elif command == 'erase':
                store.erase(url)
                print('erased')
            elif command == 'list':
                print(json.dumps(store.list()))
        except credentials.errors.CredentialsNotFound as error:
            print('NOT FOUND:', error)
        except credentials.errors.StoreError as error:
            print('STORE ERROR:', error)
        """#

    private func client(_ arguments: [String], input: String = "") throws -> ProcessOutput {
        _ = try TestBus.address()
        try Python.require("docker", package: "docker")
        let helper = try Paths.product("docker-credential-lockbox")
        let directory = URL(fileURLWithPath: helper).deletingLastPathComponent().path
        let path = directory + ":" + ProcessInfo.processInfo.environment["PATH", default: "/usr/bin:/bin"]
        return try Python.run(
            Self.client, ["lockbox"] + arguments, input: Array(input.utf8), environment: helperEnvironment(["PATH": path]))
    }

    @Test func dockersOwnClient_storeGetListErase_roundTrip() throws {
        let url = "https://\(TestBus.unique("registry")).example:5000/v2/"
        let canary = TestBus.canary() + "\"\\<&>"
        let stored = try client(["store", url, "alice"], input: canary)
        #expect(stored.stdout == "stored\n", "\(stored.combined)")

        let got = try client(["get", url])
        let answer = try #require(
            try JSONSerialization.jsonObject(with: Data(got.standardOutput)) as? [String: String], "\(got.combined)")
        #expect(answer == ["ServerURL": url, "Username": "alice", "Secret": canary])

        let listed = try client(["list", url])
        let list = try #require(try JSONSerialization.jsonObject(with: Data(listed.standardOutput)) as? [String: String])
        #expect(list[url] == "alice")

        // Storing again replaces the credential rather than failing as a duplicate.
        #expect(try client(["store", url, "bob"], input: "second").stdout == "stored\n")
        #expect(try client(["get", url]).stdout.contains("\"bob\""))

        #expect(try client(["erase", url]).stdout == "erased\n")
        let gone = try client(["get", url])
        #expect(gone.stdout.hasPrefix("NOT FOUND"), "\(gone.combined)")
        #expect(!gone.combined.contains(canary))
    }

    @Test func unknownServer_getAndErase_printExactlyDockersNotFoundText() throws {
        let helper = try Paths.product("docker-credential-lockbox")
        _ = try TestBus.address()
        let url = "https://\(TestBus.unique("absent")).example"
        for operation in ["get", "erase"] {
            let output = try runProcess(helper, [operation], input: Array((url + "\n").utf8), environment: helperEnvironment())
            #expect(output.status == 1)
            #expect(output.stdout == "credentials not found in native keychain\n")
            #expect(output.stderr.isEmpty)
        }
        #expect(try client(["get", url]).stdout.hasPrefix("NOT FOUND"))
    }

    @Test func storeWithoutServerURLOrUsername_printsDockersErrors() throws {
        let helper = try Paths.product("docker-credential-lockbox")
        _ = try TestBus.address()
        let noURL = try runProcess(
            helper, ["store"], input: Array(#"{"ServerURL":"","Username":"a","Secret":"s"}"#.utf8), environment: helperEnvironment())
        #expect(noURL.status == 1)
        #expect(noURL.stdout == "no credentials server URL\n")
        let noUser = try runProcess(
            helper, ["store"], input: Array(#"{"ServerURL":"https://x","Username":"","Secret":"s"}"#.utf8),
            environment: helperEnvironment())
        #expect(noUser.status == 1)
        #expect(noUser.stdout == "no credentials username\n")
    }

    @Test func versionOperation_printsTheHelperVersion() throws {
        let output = try runProcess(try Paths.product("docker-credential-lockbox"), ["version"])
        #expect(output.status == 0)
        #expect(output.stdout.hasPrefix("docker-credential-lockbox (lockbox) "))
    }
}
