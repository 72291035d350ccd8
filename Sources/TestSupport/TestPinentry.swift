/// The tests' pinentry: GnuPG's pinentry protocol in a shell script, answering CONFIRM from
/// the file `answers` and recording every line it was told in `record`. The answers: ok
/// (Allow once), notok (Always allow, then the passphrase), close (the window closed),
/// cancel (Deny), hang (never), passphrase (the passphrase when asked only for it),
/// anything else a wrong passphrase.
///
/// Thread-safety: no state.
public enum TestPinentry {
    public static func script(answers: String, record: String, passphrase: String) -> String {
        """
        #!/bin/sh
        answer=$(cat \(answers) 2>/dev/null || echo cancel)
        echo "OK Pleased to meet you"
        while IFS= read -r line; do
          printf '%s\\n' "$line" >> \(record)
          case "$line" in
            CONFIRM*)
              case "$answer" in
                ok) echo OK ;;
                notok|notok-wrong) echo "ERR 83886194 Not confirmed <Pinentry>" ;;
                close) echo "S BUTTON_INFO close"; echo "ERR 83886194 Not confirmed <Pinentry>" ;;
                hang) exec sleep 1000 ;;
                *) echo "ERR 83886179 Operation cancelled <Pinentry>" ;;
              esac ;;
            GETPIN*)
              case "$answer" in
                notok|passphrase) echo "D \(passphrase)"; echo OK ;;
                cancel) echo "ERR 83886179 Operation cancelled <Pinentry>" ;;
                hang) exec sleep 1000 ;;
                *) echo "D not the passphrase"; echo OK ;;
              esac ;;
            BYE*) echo OK; exit 0 ;;
            *) echo OK ;;
          esac
        done
        """
    }
}
