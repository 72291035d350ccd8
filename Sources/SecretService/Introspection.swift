/// `org.freedesktop.DBus.Introspectable` for the service's objects: their interfaces as the
/// specification defines them, and the paths below each (items are made and removed while
/// the service runs, so the tree is described when asked).
///
/// Thread-safety: pure functions of what the bus thread hands them.
enum Introspection {
    /// The document for `object` at `path`: `items` is asked only for a collection;
    /// `sessions` and `prompts` are the paths open now.
    static func document(_ object: SecretServiceBus.Object, path: String, items: (CollectionID) -> [[UInt8]],
                         sessions: [String], prompts: [String]) -> String {
        var interfaces = [Self.standardInterfaces]
        var children: [String] = []
        switch object {
        case .service:
            interfaces.append(Self.serviceXML)
            children = ["collection", "aliases", "session"] + (prompts.isEmpty ? [] : ["prompt"])
        case .collection(let collection):
            interfaces.append(Self.collectionXML)
            children = items(collection).map { String(SecretPaths.item($0, in: collection).split(separator: "/").last!) }
        case .item:
            interfaces.append(Self.itemXML)
        case .session:
            interfaces.append(Self.sessionXML)
        case .prompt:
            interfaces.append(Self.promptXML)
        case .node where path == "/" || SecretPaths.root.hasPrefix(path + "/"):
            let below = SecretPaths.root.dropFirst(path == "/" ? 1 : path.count + 1)
            children = [String(below.prefix { $0 != "/" })]
        case .node:
            if path == SecretPaths.root + "/collection" { children = CollectionID.allCases.map(\.name) }
            if path == SecretPaths.aliases { children = SecretPaths.aliasNames }
            if path == SecretPaths.root + "/session" {
                children = sessions.sorted().map { String($0.split(separator: "/").last!) }
            }
            if path == SecretPaths.root + "/prompt" {
                children = prompts.sorted().map { String($0.split(separator: "/").last!) }
            }
        }
        return """
            <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
            <node>
            \(interfaces.joined(separator: "\n"))
            \(children.map { "  <node name=\"\($0)\"/>" }.joined(separator: "\n"))
            </node>
            """
    }

    static let standardInterfaces = """
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect"><arg name="xml" type="s" direction="out"/></method>
          </interface>
          <interface name="org.freedesktop.DBus.Peer">
            <method name="Ping"/>
          </interface>
          <interface name="org.freedesktop.DBus.Properties">
            <method name="Get"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="out"/></method>
            <method name="GetAll"><arg name="interface" type="s" direction="in"/><arg name="properties" type="a{sv}" direction="out"/></method>
            <method name="Set"><arg name="interface" type="s" direction="in"/><arg name="name" type="s" direction="in"/><arg name="value" type="v" direction="in"/></method>
            <signal name="PropertiesChanged"><arg name="interface" type="s"/><arg name="changed" type="a{sv}"/><arg name="invalidated" type="as"/></signal>
          </interface>
        """

    static let serviceXML = """
          <interface name="org.freedesktop.Secret.Service">
            <method name="OpenSession"><arg name="algorithm" type="s" direction="in"/><arg name="input" type="v" direction="in"/><arg name="output" type="v" direction="out"/><arg name="result" type="o" direction="out"/></method>
            <method name="CreateCollection"><arg name="properties" type="a{sv}" direction="in"/><arg name="alias" type="s" direction="in"/><arg name="collection" type="o" direction="out"/><arg name="prompt" type="o" direction="out"/></method>
            <method name="SearchItems"><arg name="attributes" type="a{ss}" direction="in"/><arg name="unlocked" type="ao" direction="out"/><arg name="locked" type="ao" direction="out"/></method>
            <method name="Unlock"><arg name="objects" type="ao" direction="in"/><arg name="unlocked" type="ao" direction="out"/><arg name="prompt" type="o" direction="out"/></method>
            <method name="Lock"><arg name="objects" type="ao" direction="in"/><arg name="locked" type="ao" direction="out"/><arg name="Prompt" type="o" direction="out"/></method>
            <method name="GetSecrets"><arg name="items" type="ao" direction="in"/><arg name="session" type="o" direction="in"/><arg name="secrets" type="a{o(oayays)}" direction="out"/></method>
            <method name="ReadAlias"><arg name="name" type="s" direction="in"/><arg name="collection" type="o" direction="out"/></method>
            <method name="SetAlias"><arg name="name" type="s" direction="in"/><arg name="collection" type="o" direction="in"/></method>
            <signal name="CollectionCreated"><arg name="collection" type="o"/></signal>
            <signal name="CollectionDeleted"><arg name="collection" type="o"/></signal>
            <signal name="CollectionChanged"><arg name="collection" type="o"/></signal>
            <property name="Collections" type="ao" access="read"/>
          </interface>
        """

    static let collectionXML = """
          <interface name="org.freedesktop.Secret.Collection">
            <method name="Delete"><arg name="prompt" type="o" direction="out"/></method>
            <method name="SearchItems"><arg name="attributes" type="a{ss}" direction="in"/><arg name="results" type="ao" direction="out"/></method>
            <method name="CreateItem"><arg name="properties" type="a{sv}" direction="in"/><arg name="secret" type="(oayays)" direction="in"/><arg name="replace" type="b" direction="in"/><arg name="item" type="o" direction="out"/><arg name="prompt" type="o" direction="out"/></method>
            <signal name="ItemCreated"><arg name="item" type="o"/></signal>
            <signal name="ItemDeleted"><arg name="item" type="o"/></signal>
            <signal name="ItemChanged"><arg name="item" type="o"/></signal>
            <property name="Items" type="ao" access="read"/>
            <property name="Label" type="s" access="read"/>
            <property name="Locked" type="b" access="read"/>
            <property name="Created" type="t" access="read"/>
            <property name="Modified" type="t" access="read"/>
          </interface>
        """

    static let itemXML = """
          <interface name="org.freedesktop.Secret.Item">
            <method name="Delete"><arg name="Prompt" type="o" direction="out"/></method>
            <method name="GetSecret"><arg name="session" type="o" direction="in"/><arg name="secret" type="(oayays)" direction="out"/></method>
            <method name="SetSecret"><arg name="secret" type="(oayays)" direction="in"/></method>
            <property name="Locked" type="b" access="read"/>
            <property name="Attributes" type="a{ss}" access="readwrite"/>
            <property name="Label" type="s" access="readwrite"/>
            <property name="Type" type="s" access="read"/>
            <property name="Created" type="t" access="read"/>
            <property name="Modified" type="t" access="read"/>
          </interface>
        """

    static let sessionXML = """
          <interface name="org.freedesktop.Secret.Session">
            <method name="Close"/>
          </interface>
        """

    static let promptXML = """
          <interface name="org.freedesktop.Secret.Prompt">
            <method name="Prompt"><arg name="window-id" type="s" direction="in"/></method>
            <method name="Dismiss"/>
            <signal name="Completed"><arg name="dismissed" type="b"/><arg name="result" type="v"/></signal>
          </interface>
        """
}
