import FuseLowLevel

/// `accounts/<UUID>/trusted`: the account's trusted programs, one a line ("SHA256 PATH"),
/// read-only. Local inodes 2^47 + 2^46 + account serial (layout in `Identities.swift`).
///
/// Thread-safety: a value.
struct TrustedListNode: Hashable {
    let account: AccountID

    static let name = "trusted"
    private static let bit: UInt64 = LocalInode.viewBit + (1 << 46)

    init(account: AccountID) { self.account = account }

    init?(_ local: LocalInode) {
        guard local.raw >= Self.bit, local.raw < Self.bit + (1 << 44) else { return nil }  // (then `ConflictNode`)
        account = AccountID(serial: local.raw - Self.bit)
    }

    var local: LocalInode { LocalInode(Self.bit + account.serial) }
}
