#if canImport(Glibc)
import Glibc
#endif
import CredentialVault
import SecureMemory
import Posix

/// What the prompt broker needs of the store that keeps the trusted lists (the accounts
/// tree): a list read again after a prompt, the passphrase an "Always allow" is given
/// with, and the trust it then adds.
///
/// Thread-safety: called from prompt threads; the keeper locks what it reads.
protocol TrustKeeper: AnyObject, Sendable {
    func trustedPrograms(of account: [UInt8]) -> [TrustedProgram]
    func checkPassphrase(_ passphrase: SecureBytes) throws(Errno)
    func trust(_ program: TrustedProgram, account uuid: [UInt8]) throws(Errno)
}

extension AccessGuard {
    /// The one prompt broker (SPEC §3a, §2c), for an OPEN and a Secret Service call alike:
    /// asks a person on a thread of its own (one prompt per program and account at a time;
    /// a second request of the same pair waits for the first one's end: a no holds for it
    /// too, anything else and it is decided again), then tells `waiter`. An interrupt of
    /// the waiter (a Ctrl-C of the requester, a client gone from the bus) ends its wait at
    /// once, waiting or asked.
    func ask(_ requester: Requester, _ access: Access, waiter: PromptWaiter, keeper: any TrustKeeper) {
        let guardian = self
        let key = PromptKey(sha256: requester.program?.sha256 ?? [], account: access.account)
        let retry: @Sendable (PromptEnd) -> Void = { [weak keeper] end in
            guard let keeper, !waiter.isInterrupted() else { return waiter.refused(.interrupted) }
            if case .denied(let why) = end {
                guardian.record(allowed: false, why + " (the prompt it waited for)", requester, access)
                return waiter.refused(.permissionDenied)
            }
            // Decided again: the prompt that ended may have trusted this program.
            let trusted = keeper.trustedPrograms(of: access.account)
            let decision = guardian.decide(requester, access, trusted: trusted, trustVersion: 0, asking: .person)
            guardian.record(decision)
            switch decision.verdict {
            case .allowed: waiter.allowed()
            case .denied: waiter.refused(.permissionDenied)
            case .ask: guardian.ask(requester, access, waiter: waiter, keeper: keeper)
            }
        }
        let waits = !guardian.startPrompt(key, orWait: { end in
            // On a thread of its own (a new prompt may follow); without one, a no.
            if !Threads.detach({ retry(end) }) { waiter.refused(.permissionDenied) }
        })
        if waits {
            waiter.onInterrupt { waiter.refused(.interrupted) }
            return
        }
        let started = Threads.detach { [weak keeper] in
            let dialog = PinentryDialog()
            guardian.dialogStarted(dialog)
            var end = PromptEnd.other
            defer {
                guardian.dialogEnded(dialog)
                guardian.endPrompt(key, end)
            }
            waiter.onInterrupt { dialog.cancel() }
            let text = guardian.promptText(requester, access)
            let answer = dialog.ask(program: guardian.settings.program, terminal: requester.terminal,
                                    environment: guardian.settings.environment, title: text.title,
                                    description: text.description, timeout: guardian.settings.timeout,
                                    alwaysAllowText: guardian.alwaysAllowText(requester, access),
                                    unavailable: guardian.settings.problem)
            guard let keeper else { return waiter.refused(.ioError) }
            switch answer {
            case .allowOnce:
                guardian.allowOnce(requester, access)
                guardian.record(allowed: true, "allowed once at the prompt", requester, access)
                waiter.allowed()
            case .alwaysAllow(let passphrase):
                defer { passphrase.wipe() }
                do throws(Errno) {
                    guard let program = requester.program else { throw .permissionDenied }
                    try keeper.checkPassphrase(passphrase)
                    try keeper.trust(program, account: access.account)
                    guardian.record(allowed: true, "always allowed at the prompt, with the passphrase: now trusted", requester, access)
                    waiter.allowed()
                } catch {
                    let why = error == .permissionDenied ? "a wrong passphrase" : "\(error)"
                    guardian.record(allowed: false, "always allowed at the prompt, refused: \(why)", requester, access)
                    end = .denied("always allowed at the prompt, refused: \(why)")
                    waiter.refused(.permissionDenied)
                }
            case .deny:
                guardian.record(allowed: false, "denied at the prompt", requester, access)
                end = .denied("denied at the prompt")
                waiter.refused(.permissionDenied)
            case .timedOut:
                guardian.record(allowed: false, "no answer within \(Int(guardian.settings.timeout)) s", requester, access)
                end = .denied("no answer within \(Int(guardian.settings.timeout)) s")
                waiter.refused(.permissionDenied)
            case .interrupted:
                guardian.record(allowed: false, "the requester was interrupted while asked", requester, access)
                waiter.refused(.interrupted)
            case .failed(let why):
                guardian.record(allowed: false, "could not ask: \(why)", requester, access)
                waiter.refused(.permissionDenied)
            }
        }
        if !started {
            guardian.endPrompt(key, .other)
            guardian.record(allowed: false, "could not ask: no thread for the prompt", requester, access)
            waiter.refused(.permissionDenied)
        }
    }
}
