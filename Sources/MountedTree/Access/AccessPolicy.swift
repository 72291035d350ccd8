import CredentialVault

/// Guarding's one access decision (SPEC §3a). Every door — an open of a field, a write or
/// an editor's file, a conflicts file, a call on the Secret Service — asks `decide` once a
/// request, with who asks, what the request touches, the account's trusted list and the
/// version of the trusted lists it read (`Vault.trustChanges`). The door then acts on the
/// decision: an open is let through only if the version is still the vault's, checked
/// under the service's lock with the open itself (an `untrust` that lands between the two
/// makes it decide again); it records the decision in `.mtmfs/access` when it suits it (an
/// allowed open after its reply).
///
/// The table (in order): a requester the inspector refused (a traced process, a program
/// it cannot read) is denied; one whose program is unknown is denied; a trusted program
/// is allowed; an "Allow once" for this run (an open) or this bus connection (the Secret
/// Service) allows; anything else asks a person — or, at a door that asks nobody, is denied
/// with the door's reason.
extension AccessGuard {
    /// Who a door asks when the trusted list and the grants do not settle a request.
    enum Asking: Equatable {
        /// A person, through the prompt broker (an open that can wait, the bus's Unlock).
        case person
        /// Nobody: the request is refused, and the record says why.
        case nobody(String)
    }

    /// One decision about one request.
    ///
    /// Thread-safety: a value.
    struct Decision {
        let verdict: Verdict
        /// Whether the table left it to a person (before the door's `Asking`).
        let undecided: Bool
        let requester: Requester
        let access: Access
        /// `Vault.trustChanges` when the trusted list was read.
        let trustVersion: UInt64

        var isAllowed: Bool { if case .allowed = verdict { true } else { false } }
    }

    /// The decision (see the table above). Pure but for the grants' tables: it reads no
    /// file and takes no lock of the tree's.
    func decide(_ requester: Requester, _ access: Access, trusted: [TrustedProgram], trustVersion: UInt64,
                asking: Asking) -> Decision {
        let verdict = verdict(requester, access, trusted: trusted)
        var decided = verdict
        if verdict == .ask, case .nobody(let why) = asking { decided = .denied(why) }
        return Decision(verdict: decided, undecided: verdict == .ask, requester: requester, access: access,
                        trustVersion: trustVersion)
    }

    /// The decision in `.mtmfs/access` (one left to a person is recorded by the prompt).
    func record(_ decision: Decision) {
        switch decision.verdict {
        case .allowed(let why): record(allowed: true, why, decision.requester, decision.access)
        case .denied(let why): record(allowed: false, why, decision.requester, decision.access)
        case .ask: break
        }
    }
}
