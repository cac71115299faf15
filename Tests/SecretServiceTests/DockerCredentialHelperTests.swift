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

    @Test(arguments: [#"{"a":1}"#, #"{"a":"b""#, #"{"a":"\x"}"#, #"{"a":"\u12"}"#, "", #"{"a":"b"} x"#, "[]", #"{"a":["b"}"#])
    func parse_malformedInput_throws(_ text: String) {
        #expect(throws: FlatJSON.ParseError.self) { try FlatJSON.parseObject(Array(text.utf8)) }
    }

    @Test func parseFirstObject_membersOfAnyType_areReadInOrder_andTextAfterTheObjectIsNotRead() throws {
        let members = try FlatJSON.parseFirstObject(
            Array(#"{"n": -1.5e3, "o": {"a": [1, true, false, null, {"b": "c"}], "d": {}}, "s": "x", "z": null, "e": []} {garbage"#.utf8))
        #expect(members.map(\.key) == ["n", "o", "s", "z", "e"])
        #expect(members.map(\.value) == [.other, .other, .string(Array("x".utf8)), .null, .other])
        #expect(try FlatJSON.parseFirstObject(Array(" null ".utf8)).isEmpty)
    }

    @Test(arguments: ["", "  ", "[1]", #""s""#, "{", #"{"a":01}"#, #"{"a":1.}"#, #"{"a":tru}"#, #"{"a":[1,]}"#, #"{"a":{"b"}}"#])
    func parseFirstObject_malformedOrNotAnObject_throws(_ text: String) {
        #expect(throws: FlatJSON.ParseError.self) { try FlatJSON.parseFirstObject(Array(text.utf8)) }
    }

    @Test func parseFirstObject_loneSurrogate_readsAsReplacementCharacter_asGoReadsIt() throws {
        let members = try FlatJSON.parseFirstObject(Array(#"{"a":"x\ud800y\udc00\ud83d\ude00"}"#.utf8))
        #expect(members.first?.value == .string(Array("x\u{FFFD}y\u{FFFD}😀".utf8)))
    }

    @Test func parseFirstObject_deepNesting_isRefused_withoutRecursion() throws {
        let deep = Array(#"{"a":"#.utf8) + [UInt8](repeating: UInt8(ascii: "["), count: 100_000)
            + [UInt8](repeating: UInt8(ascii: "]"), count: 100_000) + [UInt8(ascii: "}")]
        #expect(throws: FlatJSON.ParseError.self) { try FlatJSON.parseFirstObject(deep) }
        let shallow = Array(#"{"a":"#.utf8) + [UInt8](repeating: UInt8(ascii: "["), count: 100)
            + [UInt8](repeating: UInt8(ascii: "]"), count: 100) + Array(#","b":"c"}"#.utf8)
        #expect(try FlatJSON.parseFirstObject(shallow).last?.value == .string(Array("c".utf8)))
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

    /// What docker-credential-helpers' Go decoder accepts for `store` (@URL@ and @SECRET@ stand
    /// for the server URL and the secret); the flag tells whether a secret was given.
    static let goAcceptedInputs: [(String, Bool)] = [
        (#"{"serverurl":"@URL@","username":"alice","secret":"@SECRET@"}"#, true),
        (#"{"SERVERURL":"@URL@","USERNAME":"alice","SECRET":"@SECRET@"}"#, true),
        (#"{"sErVeRuRl":"@URL@","Username":"alice","ſecret":"@SECRET@"}"#, true),
        (#"{"ServerURL":"@URL@","Username":"alice","Secret":"@SECRET@","Email":null,"Extra":{"a":[1,-2.5e3,true,false,null,{"b":"c"}]},"n":7}"#, true),
        (#"{"ServerURL":"@URL@","Username":"alice","Secret":null}"#, false),
        (#"{"ServerURL":"@URL@","Username":"alice"}"#, false),
        ("{\r\n  \"ServerURL\": \"@URL@\",\r\n  \"Username\": \"alice\",\r\n  \"Secret\": \"@SECRET@\"\r\n}\r\n", true),
        (#"{"ServerURL":"@URL@","Username":"bob","username":"alice","Secret":"@SECRET@"} trailing text"#, true),
    ]

    @Test(arguments: goAcceptedInputs)
    func store_inputThatDockersGoDecoderAccepts_isStoredAsDockerStoresIt(template: String, hasSecret: Bool) throws {
        let helper = try Paths.product("docker-credential-lockbox")
        _ = try TestBus.address()
        let url = "https://\(TestBus.unique("go")).example"
        let canary = TestBus.canary()
        let input = template.replacingOccurrences(of: "@URL@", with: url).replacingOccurrences(of: "@SECRET@", with: canary)
        let stored = try runProcess(helper, ["store"], input: Array(input.utf8), environment: helperEnvironment())
        #expect(stored.status == 0, "\(stored.combined)")
        #expect(!stored.combined.contains(canary))
        let got = try runProcess(helper, ["get"], input: Array(url.utf8), environment: helperEnvironment())
        #expect(got.status == 0, "\(got.combined)")
        let answer = try JSONSerialization.jsonObject(with: Data(got.standardOutput)) as? [String: String]
        #expect(answer == ["ServerURL": url, "Username": "alice", "Secret": hasSecret ? canary : ""])
        _ = try runProcess(helper, ["erase"], input: Array(url.utf8), environment: helperEnvironment())
    }

    @Test(arguments: [#"{"ServerURL":"@URL@","Username":"alice","Secret":5}"#, #"{"ServerURL":["@URL@"],"Username":"alice"}"#])
    func store_wantedFieldThatIsNotAString_isRefusedAsGoRefusesIt(template: String) throws {
        let helper = try Paths.product("docker-credential-lockbox")
        _ = try TestBus.address()
        let url = "https://\(TestBus.unique("typed")).example"
        let input = template.replacingOccurrences(of: "@URL@", with: url)
        let stored = try runProcess(helper, ["store"], input: Array(input.utf8), environment: helperEnvironment())
        #expect(stored.status == 1)
        #expect(stored.stdout.contains("is not a string"), "\(stored.stdout)")
        let got = try runProcess(helper, ["get"], input: Array(url.utf8), environment: helperEnvironment())
        #expect(got.stdout == "credentials not found in native keychain\n")
    }

    @Test func store_inputOver1MiB_isRefusedWithTheLimitNamed() throws {
        let helper = try Paths.product("docker-credential-lockbox")
        _ = try TestBus.address()
        let url = "https://\(TestBus.unique("huge")).example"
        let padding = String(repeating: "p", count: DockerCredentialHelper.maximumInputSize)
        let input = #"{"ServerURL":"\#(url)","Username":"alice","Secret":"s","Padding":"\#(padding)"}"#
        let stored = try runProcess(helper, ["store"], input: Array(input.utf8), environment: helperEnvironment())
        #expect(stored.status == 1)
        #expect(stored.stdout.contains("1 MiB"), "\(stored.stdout)")
        let got = try runProcess(helper, ["get"], input: Array(url.utf8), environment: helperEnvironment())
        #expect(got.stdout == "credentials not found in native keychain\n")
    }

    @Test func versionOperation_printsTheHelperVersion() throws {
        let output = try runProcess(try Paths.product("docker-credential-lockbox"), ["version"])
        #expect(output.status == 0)
        #expect(output.stdout.hasPrefix("docker-credential-lockbox (lockbox) "))
    }
}
