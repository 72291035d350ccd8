@testable import MountedTree
import Testing

/// A pinentry refuses text it cannot show in its locale ("ERR 83886246 A locale function
/// failed"): a daemon started after `su -`, from a systemd unit or cron has no UTF-8 locale,
/// and every guarded prompt (`…`, `←`) failed. The pinentry's environment gets a UTF-8
/// character type; where none exists the text is ASCII.
@Suite struct PromptLocaleTests {
    static func value(_ name: String, _ environment: [String]) -> String? {
        environment.first { $0.hasPrefix(name + "=") }.map { String($0.dropFirst(name.count + 1)) }
    }

    @Test func noLocaleGetsAUTF8CharacterType() {
        let environment = PromptSettings.pinentryEnvironment(from: ["HOME=/home/u", "TERM=xterm"])
        #expect(Self.value("LC_CTYPE", environment) == "C.UTF-8")
        #expect(PromptSettings.displayable("a … b ← c", in: environment) == "a … b ← c")
    }

    @Test func lcAllCIsReplacedAndItsMessagesKept() {
        let environment = PromptSettings.pinentryEnvironment(from: ["LC_ALL=C", "LANG=de_DE"])
        #expect(Self.value("LC_ALL", environment) == nil)
        #expect(Self.value("LC_CTYPE", environment) == "C.UTF-8")
        #expect(Self.value("LC_MESSAGES", environment) == "C")
    }

    @Test func aUTF8LocaleIsLeftAlone() {
        let given = ["LANG=fr_FR.UTF-8", "HOME=/h"]
        let environment = PromptSettings.pinentryEnvironment(from: given)
        #expect(Self.value("LANG", environment) == "fr_FR.UTF-8")
        #expect(Self.value("LC_CTYPE", environment) == nil)
    }

    @Test func withoutAUTF8LocaleTheTextIsASCII() {
        #expect(PromptSettings.displayable("git ← bash … “x” — ok é", in: ["LC_ALL=C"]) == "git <- bash ... \"x\" - ok ?")
    }
}
