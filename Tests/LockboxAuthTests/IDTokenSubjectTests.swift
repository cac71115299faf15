import Foundation
import Testing

@testable import LockboxAuth

/// The subject `lockbox auth status` shows, read from an ID token without trusting it.
@Suite("The subject of an ID token")
struct IDTokenSubjectTests {
    static func jwt(_ claims: String) -> String {
        let payload = Data(claims.utf8).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        return "eyJhbGciOiJSUzI1NiJ9.\(payload).c2lnbmF0dXJl"
    }

    @Test func idToken_withSubClaim_givesTheSubject() {
        #expect(TokenEndpoint.subject(ofIDToken: Self.jwt(#"{"sub":"alice@example.com","aud":"x"}"#)) == "alice@example.com")
    }

    @Test func idToken_withControlCharactersInSub_givesNothing() {
        #expect(TokenEndpoint.subject(ofIDToken: Self.jwt(#"{"sub":"alice\u001b[2J"}"#)) == nil)
    }

    @Test(arguments: ["", "a.b", "a.!!!.c", "x.e30.y"])
    func malformedIDToken_givesNothing(_ token: String) {
        #expect(TokenEndpoint.subject(ofIDToken: token) == nil)
    }
}
