#!/usr/bin/python3
"""A stand-in for systemd-logind on a test's own bus: owns org.freedesktop.login1, serves
two sessions' `User` property (session _31 is the given user's, _32 another user's) and
emits, for each line read on standard input:

  sleep         Manager.PrepareForSleep(true)     wake    Manager.PrepareForSleep(false)
  lock          Session.Lock on session _31       lock-other   Session.Lock on session _32

It prints "ready" once the name is owned, and "sent LINE" after each signal.
Run with Debian's python3 (python3-dbus, python3-gi); the bus is DBUS_SESSION_BUS_ADDRESS.
"""
import sys

import dbus
import dbus.service
from dbus.mainloop.glib import DBusGMainLoop
from gi.repository import GLib

LOGIN1 = "org.freedesktop.login1"
MANAGER = LOGIN1 + ".Manager"
SESSION = LOGIN1 + ".Session"


class Manager(dbus.service.Object):
    @dbus.service.signal(MANAGER, signature="b")
    def PrepareForSleep(self, start):
        pass


class Session(dbus.service.Object):
    def __init__(self, bus, path, uid):
        super().__init__(bus, path)
        self.uid = uid

    @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="ss", out_signature="v")
    def Get(self, interface, name):
        if interface != SESSION or name != "User":
            raise dbus.exceptions.DBusException("no such property", name="org.freedesktop.DBus.Error.UnknownProperty")
        return dbus.Struct((dbus.UInt32(self.uid), dbus.ObjectPath("/org/freedesktop/login1/user/_%d" % self.uid)),
                           signature="uo")

    @dbus.service.signal(SESSION, signature="")
    def Lock(self):
        pass


def main():
    uid = int(sys.argv[1])
    DBusGMainLoop(set_as_default=True)
    bus = dbus.SessionBus()
    name = dbus.service.BusName(LOGIN1, bus)
    manager = Manager(bus, "/org/freedesktop/login1")
    own = Session(bus, "/org/freedesktop/login1/session/_31", uid)
    other = Session(bus, "/org/freedesktop/login1/session/_32", uid + 1)
    loop = GLib.MainLoop()

    def command(source, condition):
        line = sys.stdin.readline()
        if not line:
            loop.quit()
            return False
        word = line.strip()
        if word == "sleep":
            manager.PrepareForSleep(True)
        elif word == "wake":
            manager.PrepareForSleep(False)
        elif word == "lock":
            own.Lock()
        elif word == "lock-other":
            other.Lock()
        print("sent " + word, flush=True)
        return True

    GLib.io_add_watch(sys.stdin, GLib.IO_IN | GLib.IO_HUP, command)
    print("ready", flush=True)
    loop.run()
    del name


if __name__ == "__main__":
    main()
