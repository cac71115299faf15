import Foundation
import Testing

@testable import LockboxAuth

/// Regressions found by fuzzing the token endpoint (docs/FUZZING.md, target `token-response`).
@Suite("The Date header of a token response")
struct HTTPDateTests {
    @Test("A Date header with non-ASCII bytes is ignored instead of trapping in DateFormatter")
    func httpDate_withNonASCIIBytes_isNil() {
        let header = String(decoding: Array("Sun 29".utf8) + [0xDC, 0xB1, 0x90, 0x89] + Array(" 2026 13:00:00 GMT".utf8), as: UTF8.self)
        #expect(TokenEndpoint.httpDate(header) == nil)
    }

    @Test func httpDate_withAnIMFFixdate_parses() {
        #expect(TokenEndpoint.httpDate("Sun, 29 Nov 2026 13:00:00 GMT") == Date(timeIntervalSince1970: 1_795_957_200))
    }

    @Test func httpDate_withAnOverlongHeader_isNil() {
        #expect(TokenEndpoint.httpDate("Sun, 29 Nov 2026 13:00:00 GMT" + String(repeating: " ", count: 64)) == nil)
    }
}
