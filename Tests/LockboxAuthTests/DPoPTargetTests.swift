import Foundation
@testable import LockboxAuth
import LockboxTestSupport
import Testing

@Suite("A DPoP proof's request: htu and htm as RFC 9449 and RFC 9110 have them")
struct DPoPTargetTests {
    @Test("htu leaves out user information (a password in the URL), the query and the fragment, and has its scheme in lower case")
    func targetURI_leavesOutUserInformation() throws {
        let cases: [(String, String)] = [
            ("https://user:CANARY-1234567890@api.example.com:8443/v1/items?x=1#f", "https://api.example.com:8443/v1/items"),
            ("https://user@api.example.com/a@b", "https://api.example.com/a@b"),
            ("https://api.example.com/v1?user=a@b", "https://api.example.com/v1"),
            ("HTTPS://api.example.com/Path", "https://api.example.com/Path"),
            ("https://api.example.com", "https://api.example.com"),
        ]
        for (given, expected) in cases {
            #expect(DPoPProofFactory.targetURI(try #require(URL(string: given))) == expected, "\(given)")
        }
    }

    @Test("--method takes an HTTP method: an empty one, or one with a space or a line break, is a usage error")
    func method_isAToken() throws {
        let directory = TemporaryDirectory("lockbox-dpop-method")
        for bad in ["", "G ET", "GET\r\nX-Evil: 1", "ÄÖ"] {
            let result = try run(
                builtProduct("lockbox"), ["--keychain", directory.file("k.lockbox"), "token", "--method", bad, "--url", "https://api.example.com/"])
            #expect(result.status == 64 && result.standardError.contains("--method takes an HTTP method"), "\(bad.debugDescription): \(result.standardError)")
        }
    }
}
