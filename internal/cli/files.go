package cli

import (
	"time"

	"github.com/batonhq/baton/api"
)

// fileFlags are the API's policies of attachments; `baton api` and `baton
// dev` share them. A flag left out means the API's default.
type fileFlags struct {
	MaxFileBytes       int64         `name:"max-file-bytes" env:"BATON_MAX_FILE_BYTES" setting:"MaxFileBytes" help:"Largest file a message may carry, in bytes; larger gets 413 file_too_large. The request body's limit grows with it. Defaults to ${max_file_bytes}."`
	MaxFilesPerMessage int           `name:"max-files-per-message" env:"BATON_MAX_FILES_PER_MESSAGE" setting:"MaxFilesPerMessage" help:"Files one message may carry; more get 413 too_many_files. Defaults to ${max_files_per_message}."`
	MaxUserFileBytes   int64         `name:"max-user-file-bytes" env:"BATON_MAX_USER_FILE_BYTES" setting:"MaxUserFileBytes" help:"Bytes one user's files may take together, identical files counted once; past it 413 file_quota_exceeded. Deleting conversations frees what only they used. Negative turns the quota off. Defaults to ${max_user_file_bytes}."`
	FileMediaTypes     []string      `name:"file-media-types" env:"BATON_FILE_MEDIA_TYPES" sep:"," setting:"FileMediaTypes" placeholder:"TYPE" help:"Media types of files taken, as found in their bytes (not as declared), comma-separated: image/png, image/jpeg, image/gif, image/webp (or image/* for all four), application/pdf, text/plain; others get 415 unsupported_media_type. Defaults to ${file_media_types}."`
	FileLinkTTL        time.Duration `name:"file-link-ttl" env:"BATON_FILE_LINK_TTL" setting:"FileLinkTTL" help:"How long the signed links to files that a chat's history gives (for <img>, which sends no bearer token) work. Defaults to ${file_link_ttl}."`
}

// withFiles returns cfg with the file policies set.
func (f fileFlags) withFiles(cfg api.Config) api.Config {
	cfg.MaxFileBytes, cfg.MaxFilesPerMessage, cfg.MaxUserFileBytes = f.MaxFileBytes, f.MaxFilesPerMessage, f.MaxUserFileBytes
	cfg.FileMediaTypes, cfg.FileLinkTTL = f.FileMediaTypes, f.FileLinkTTL
	return cfg
}
