package bucket

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
)

//go:embed lua/*.lua
var luaFS embed.FS

// script is one Lua script: its source and the SHA1 digest EVALSHA names it by.
type script struct {
	name string
	src  string
	sha  string
}

// newScript reads lua/<name>; withCommon prepends lua/common.lua (the shared
// helpers), making one self-contained source.
func newScript(name string, withCommon bool) *script {
	body, err := luaFS.ReadFile("lua/" + name)
	if err != nil {
		panic("bucket: missing embedded script " + name)
	}
	src := string(body)
	if withCommon {
		common, err := luaFS.ReadFile("lua/common.lua")
		if err != nil {
			panic("bucket: missing embedded script common.lua")
		}
		src = string(common) + "\n" + src
	}
	sum := sha1.Sum([]byte(src))
	return &script{name: name, src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	depositScript  = newScript("deposit.lua", true)
	spendScript    = newScript("spend.lua", true)
	closeScript    = newScript("close.lua", true)
	balanceScript  = newScript("balance.lua", true)
	addScript      = newScript("add.lua", true)
	unlockScript   = newScript("unlock.lua", false)
	extendScript   = newScript("extend.lua", false)
	reserveScript  = newScript("reserve.lua", true)
	releaseScript  = newScript("release.lua", true)
	reservesScript = newScript("reservations.lua", true)
	usageScript    = newScript("usage.lua", true)
	fallbackScript = newScript("fallback.lua", true)
	snapshotScript = newScript("snapshot.lua", true)
	settleScript   = newScript("settle.lua", true)

	allScripts = []*script{depositScript, spendScript, closeScript, balanceScript, addScript, unlockScript, extendScript,
		reserveScript, releaseScript, reservesScript, usageScript, fallbackScript, snapshotScript, settleScript, rateScript, slotsScript}
)

// summaryField is the bucket field of the spend summary (lua/common.lua's
// SUMMARY): what a warm spend reads instead of the whole bucket.
const summaryField = "z:spend"
